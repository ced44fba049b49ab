// The row math of RMSNorm and LayerNormalization, shared by the plain norm kernels (norm.cc)
// and the fused ones (fused_rowwise.cc) so that both give the same bits.
//
// Statistics accumulate in double: element j goes to partial sum j % 32 (32 running sums in
// four or eight vectors: one running sum would wait on every add's latency), the partials are
// then added as a balanced tree. Two passes for the variance. The normalization runs in f32.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "cpu/kernels/kernel_util.h"

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

// The partial sums live in vectors of the target's width: four 512-bit vectors on AVX-512, eight
// 256-bit ones elsewhere (a 512-bit vector type without AVX-512 is passed through memory at
// every call, several times slower than 256-bit vectors in registers). Either
// way element j goes to partial j % 32 and the partials meet in the same tree: the same bits.
#if defined(__AVX512F__)
inline constexpr int kRowSumLanes = 8;
#else
inline constexpr int kRowSumLanes = 4;
#endif
using F32v = float __attribute__((vector_size(4 * kRowSumLanes)));
using F64v = double __attribute__((vector_size(8 * kRowSumLanes)));

// kRowSumLanes floats widened to double. The intrinsics matter: GCC 12 lowers the generic
// conversion of four floats to two 2-lane converts joined through the stack. On AVX-512 the
// zero-masked form with every lane set (the same vcvtps2pd): GCC 12's _mm512_cvtps_pd passes
// an undefined vector that -Wmaybe-uninitialized flags once inlined here.
inline F64v LoadAsF64v(const float* x) {
#if defined(__AVX512F__)
  return reinterpret_cast<F64v>(_mm512_maskz_cvtps_pd(static_cast<__mmask8>(0xFF), _mm256_loadu_ps(x)));
#elif defined(__AVX__)
  return reinterpret_cast<F64v>(_mm256_cvtps_pd(_mm_loadu_ps(x)));
#else
  F32v v;
  std::memcpy(&v, x, sizeof v);
  return __builtin_convertvector(v, F64v);
#endif
}

// sum_j f(x[j]) in double; f takes and returns a double or an F64v (write it with `auto`).
// `add(acc, v)` adds f of a whole vector: acc + f(v), or a fused form with the same bits.
template <class F, class Add>
double RowSumWith(const float* x, int64_t n, F f, Add add) {
  constexpr int kW = kRowSumLanes, kAcc = 32 / kW;
  F64v acc[kAcc] = {};
  const int64_t full = n - n % 32;
  for (int64_t j = 0; j < full; j += 32) {
#pragma GCC unroll 8
    for (int k = 0; k < kAcc; ++k) {
      acc[k] = add(acc[k], LoadAsF64v(x + j + kW * k));
    }
  }
  if (full < n) {  // the tail indexes the partials lane by lane: in memory, apart from the loop's registers
    double t[32];
    std::memcpy(t, acc, sizeof t);
    for (int64_t j = full; j < n; ++j) t[j - full] += f(static_cast<double>(x[j]));
    std::memcpy(acc, t, sizeof t);
  }
  // The tree over 8 partials p[0..7], each p[l] = (s[l] + s[l + 8]) + (s[l + 16] + s[l + 24]).
  double p[8];
  if constexpr (kW == 8) {
    const F64v a = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (int l = 0; l < 8; ++l) p[l] = a[l];
  } else {  // acc[2k] holds partials 8k .. 8k+3, acc[2k+1] partials 8k+4 .. 8k+7
    const F64v lo = (acc[0] + acc[2]) + (acc[4] + acc[6]), hi = (acc[1] + acc[3]) + (acc[5] + acc[7]);
    for (int l = 0; l < 4; ++l) p[l] = lo[l], p[l + 4] = hi[l];
  }
  return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

template <class F>
double RowSumD(const float* x, int64_t n, F f) {
  return RowSumWith(x, n, f, [&](F64v acc, F64v v) { return acc + f(v); });
}

// sum_j x[j]^2 in double, with RowSumD's bits: the square of an f32 value is exact in double
// (48 significant bits), so acc + v * v == fma(v, v, acc), and one fused multiply-add per
// vector replaces the multiply and the add.
inline double RowSumSquaresD(const float* x, int64_t n) {
  auto square = [](auto v) { return v * v; };
#if defined(__AVX512F__)
  return RowSumWith(x, n, square, [](F64v acc, F64v v) {
    const __m512d d = reinterpret_cast<__m512d>(v);
    return reinterpret_cast<F64v>(_mm512_fmadd_pd(d, d, reinterpret_cast<__m512d>(acc)));
  });
#elif defined(__FMA__)
  return RowSumWith(x, n, square, [](F64v acc, F64v v) {
    const __m256d d = reinterpret_cast<__m256d>(v);
    return reinterpret_cast<F64v>(_mm256_fmadd_pd(d, d, reinterpret_cast<__m256d>(acc)));
  });
#else
  return RowSumD(x, n, square);
#endif
}

// A row's 1 / sqrt(mean(x^2) + eps) from its sum of squares over d values: RMSNorm's factor,
// also what a folded RMSNorm computes (FusedGemm's rms_epsilon output, FusedAttention's rows).
inline float InvRms(double sum_squares, int64_t d, double eps) {
  return static_cast<float>(1.0 / std::sqrt(sum_squares / static_cast<double>(d) + eps));
}

// y = x / sqrt(mean(x^2) + eps) * scale (scale may be null: 1).
inline void RmsNormRow(const float* x, float* y, int64_t d, const float* scale, double eps) {
  const float inv = InvRms(RowSumSquaresD(x, d), d, eps);
  if (scale) {
    for (int64_t j = 0; j < d; ++j) y[j] = x[j] * inv * scale[j];
  } else {
    for (int64_t j = 0; j < d; ++j) y[j] = x[j] * inv;
  }
}

// y = (x - mean) / sqrt(var + eps) * scale + bias (bias may be null: 0); the f32 mean and
// inverse standard deviation go to *mean_out / *inv_out when those are not null.
// A LayerNorm row's statistics: its mean and 1 / sqrt(var + eps), rounded to f32 as the
// normalization uses them.
struct LayerNormStats {
  float mean, inv;
};

inline LayerNormStats LayerNormRowStats(const float* x, int64_t d, double eps) {
  const double dd = static_cast<double>(d);
  const double mean = RowSumD(x, d, [](auto v) { return v; }) / dd;
  const double var = RowSumD(x, d, [mean](auto v) { return (v - mean) * (v - mean); }) / dd;
  return {static_cast<float>(mean), static_cast<float>(1.0 / std::sqrt(var + eps))};
}

// y = (x - mean) * inv * scale (+ bias) with a row's statistics: FusedLayerNorms applies one
// row's statistics to several (scale, bias) pairs, with the bits of separate LayerNorms.
inline void LayerNormRowApply(const float* x, float* y, int64_t d, const float* scale, const float* bias,
                              LayerNormStats st) {
  const float mf = st.mean, inv = st.inv;
  if (bias) {
    for (int64_t j = 0; j < d; ++j) y[j] = (x[j] - mf) * inv * scale[j] + bias[j];
  } else {
    for (int64_t j = 0; j < d; ++j) y[j] = (x[j] - mf) * inv * scale[j];
  }
}

inline void LayerNormRow(const float* x, float* y, int64_t d, const float* scale, const float* bias, double eps,
                         float* mean_out = nullptr, float* inv_out = nullptr) {
  const LayerNormStats st = LayerNormRowStats(x, d, eps);
  LayerNormRowApply(x, y, d, scale, bias, st);
  if (mean_out) *mean_out = st.mean;
  if (inv_out) *inv_out = st.inv;
}

}  // namespace graphfuse::kernels
