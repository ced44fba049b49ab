// The row math of RMSNorm and LayerNormalization, shared by the plain norm kernels (norm.cc)
// and the fused ones (fused_rowwise.cc) so that both give the same bits.
//
// Statistics accumulate in double: element j goes to partial sum j % 32 (four 512-bit vectors
// of eight lanes: one running sum would wait on every add's latency; measured 2.6 elements per
// cycle with one vector, about 4x that with four), the partials are then added as a balanced
// tree. Two passes for the variance. The normalization runs in f32.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kernel_util.h"

namespace graphfuse::kernels {

// A norm parameter (Scale / B) broadcast to one full row over `norm` (X.shape[axis:]), in f32.
inline std::vector<float> ParamRow(const TensorView& p, const Shape& norm) {
  const int64_t d = Product(norm);
  std::vector<float> row(static_cast<size_t>(d));
  if (d > 0 && p.dtype == DType::kF32 && Product(p.shape) == d) {  // the usual [D] parameter: a copy
    std::memcpy(row.data(), p.data, static_cast<size_t>(d) * sizeof(float));
    return row;
  }
  const std::vector<int64_t> st = BroadcastStrides(p.shape, norm);
  std::vector<int64_t> idx(norm.size(), 0);
  for (int64_t j = 0; j < d; ++j) {
    int64_t off = 0;
    for (size_t k = 0; k < idx.size(); ++k) off += idx[k] * st[k];
    row[static_cast<size_t>(j)] = static_cast<float>(LoadAsDouble(p, off));
    for (size_t k = idx.size(); k-- > 0;) {
      if (++idx[k] < norm[k]) break;
      idx[k] = 0;
    }
  }
  return row;
}

using F32x8 = float __attribute__((vector_size(32)));
using F64x8 = double __attribute__((vector_size(64)));

// sum_j f(x[j]) in double; f takes and returns a double or an F64x8 (write it with `auto`).
// `add(acc, v)` adds f of a whole vector: acc + f(v), or a fused form with the same bits.
template <class F, class Add>
double RowSumWith(const float* x, int64_t n, F f, Add add) {
  F64x8 acc[4] = {};
  const int64_t full = n - n % 32;
  for (int64_t j = 0; j < full; j += 32)
    for (int k = 0; k < 4; ++k) {
      F32x8 v;
      std::memcpy(&v, x + j + 8 * k, sizeof v);
      acc[k] = add(acc[k], __builtin_convertvector(v, F64x8));
    }
  for (int64_t j = full; j < n; ++j) acc[(j - full) / 8][(j - full) % 8] += f(static_cast<double>(x[j]));
  const F64x8 a = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

template <class F>
double RowSumD(const float* x, int64_t n, F f) {
  return RowSumWith(x, n, f, [&](F64x8 acc, F64x8 v) { return acc + f(v); });
}

// sum_j x[j]^2 in double, with RowSumD's bits: the square of an f32 value is exact in double
// (48 significant bits), so acc + v * v == fma(v, v, acc), and on AVX-512 one fused
// multiply-add per vector replaces the multiply and the add (15% faster on a 128 x 512 block
// here).
inline double RowSumSquaresD(const float* x, int64_t n) {
  auto square = [](auto v) { return v * v; };
#if defined(__AVX512F__)
  return RowSumWith(x, n, square, [](F64x8 acc, F64x8 v) {
    const __m512d d = reinterpret_cast<__m512d>(v);
    return reinterpret_cast<F64x8>(_mm512_fmadd_pd(d, d, reinterpret_cast<__m512d>(acc)));
  });
#else
  return RowSumD(x, n, square);
#endif
}

// y = x / sqrt(mean(x^2) + eps) * scale (scale may be null: 1).
inline void RmsNormRow(const float* x, float* y, int64_t d, const float* scale, double eps) {
  const double ms = RowSumSquaresD(x, d) / static_cast<double>(d);
  const float inv = static_cast<float>(1.0 / std::sqrt(ms + eps));
  if (scale) {
    for (int64_t j = 0; j < d; ++j) y[j] = x[j] * inv * scale[j];
  } else {
    for (int64_t j = 0; j < d; ++j) y[j] = x[j] * inv;
  }
}

// y = (x - mean) / sqrt(var + eps) * scale + bias (bias may be null: 0); the f32 mean and
// inverse standard deviation go to *mean_out / *inv_out when those are not null.
inline void LayerNormRow(const float* x, float* y, int64_t d, const float* scale, const float* bias, double eps,
                         float* mean_out = nullptr, float* inv_out = nullptr) {
  const double dd = static_cast<double>(d);
  const double mean = RowSumD(x, d, [](auto v) { return v; }) / dd;
  const double var = RowSumD(x, d, [mean](auto v) { return (v - mean) * (v - mean); }) / dd;
  const float mf = static_cast<float>(mean), inv = static_cast<float>(1.0 / std::sqrt(var + eps));
  if (bias) {
    for (int64_t j = 0; j < d; ++j) y[j] = (x[j] - mf) * inv * scale[j] + bias[j];
  } else {
    for (int64_t j = 0; j < d; ++j) y[j] = (x[j] - mf) * inv * scale[j];
  }
  if (mean_out) *mean_out = mf;
  if (inv_out) *inv_out = inv;
}

}  // namespace graphfuse::kernels
