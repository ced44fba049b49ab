// The softmax of one contiguous f32 row, in pieces shared by Softmax / LogSoftmax (softmax.cc),
// the fused softmax of fused_rowwise.cc and FusedAttention's score rows (attention.cc), so
// that all three agree bit for bit:
//   m = max(x) (NaN when the row holds NaN), e = exp(x - m) per lane, sum = f32 lane sums of e
//   added in double, softmax = e * float(1 / sum).
// exp is simd::exp_softmax (src/cpu/simd.h): simd::exp on AVX-512 and AVX2, within 1 ulp of
// the correctly rounded result. A softmax of f32 scores is checked within 1e-5 relative
// (tests/kernels_test.cc). A vector whose every lane lies more than 104 below the max (a causal
// or padding mask's keys, -inf or -1e9) stores +0 without calling exp: below -104 the correctly
// rounded exp is +0 (e^-104 is under half the smallest subnormal), and so is exp_softmax's
// (tests/kernels_test.cc checks it). NaN lanes compare false and take the exp path.
#pragma once

#include <cstdint>
#include <limits>

#include "cpu/simd.h"

namespace graphfuse::kernels {

// Lanes [0, rem) of x, `fill` in the others.
inline simd::VF LoadTail(const float* x, int64_t rem, float fill) {
  alignas(64) float buf[simd::kLanes];
  for (int l = 0; l < simd::kLanes; ++l) buf[l] = l < rem ? x[l] : fill;
  return simd::VF::Load(buf);
}
inline void StoreTail(simd::VF v, float* y, int64_t rem) {
  alignas(64) float buf[simd::kLanes];
  v.Store(buf);
  for (int64_t l = 0; l < rem; ++l) y[l] = buf[l];
}

// m = the lane-wise max of m and x[0, n) (NaN-propagating; a ragged tail padded with -inf).
// Four running maxima over consecutive vectors, met at the end: one would wait on each max's
// compare-and-blend latency.
// The max's value does not depend on the order; only the sign of a zero max may, and no user
// can tell: exp(x - (+0)) and exp(x - (-0)) are equal, and so is m + log(sum) for m = +/-0.
inline void MaxInto(simd::VF& m, const float* x, int64_t n) {
  using simd::kLanes;
  using simd::VF;
  int64_t i = 0;
  if (n >= 4 * kLanes) {
    VF m1 = VF::Load(x + kLanes), m2 = VF::Load(x + 2 * kLanes), m3 = VF::Load(x + 3 * kLanes);
    m = simd::max(m, VF::Load(x));
    for (i = 4 * kLanes; i + 4 * kLanes <= n; i += 4 * kLanes) {
      m = simd::max(m, VF::Load(x + i));
      m1 = simd::max(m1, VF::Load(x + i + kLanes));
      m2 = simd::max(m2, VF::Load(x + i + 2 * kLanes));
      m3 = simd::max(m3, VF::Load(x + i + 3 * kLanes));
    }
    m = simd::max(simd::max(m, m1), simd::max(m2, m3));
  }
  for (; i + kLanes <= n; i += kLanes) m = simd::max(m, VF::Load(x + i));
  if (i < n) m = simd::max(m, LoadTail(x + i, n - i, -std::numeric_limits<float>::infinity()));
}

inline float RowMax(const float* x, int64_t n) {
  simd::VF m(-std::numeric_limits<float>::infinity());
  MaxInto(m, x, n);
  return simd::MaxOfLanesNaN(m);
}

// y = exp(x - m) (not stored when y is null; y may be x); returns the sum of the exps.
inline double ExpShiftSum(const float* x, float* y, int64_t n, float m) {
  using simd::kLanes;
  using simd::VF;
  const VF vm(m), underflow(-104.0);
  VF acc(0.0);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const VF d = VF::Load(x + i) - vm;
    if (simd::hn::AllTrue(simd::DF(), simd::hn::Lt(d.v, underflow.v))) {
      if (y) VF(0.0).Store(y + i);
      continue;  // adding +0 to the sum would change nothing
    }
    const VF e = simd::exp_softmax(d);
    if (y) e.Store(y + i);
    acc = acc + e;
  }
  if (i < n) {
    const VF e = simd::exp_softmax(LoadTail(x + i, n - i, -std::numeric_limits<float>::infinity()) - vm);
    if (y) StoreTail(e, y + i, n - i);
    acc = acc + e;  // padded lanes are exp(-inf) = 0 (NaN when m is NaN, which the row is anyway)
  }
  return simd::SumOfLanesF64(acc);
}

// y = softmax(x); x and y may be the same row.
inline void SoftmaxRow(const float* x, float* y, int64_t n) {
  if (n == 0) return;
  const double sum = ExpShiftSum(x, y, n, RowMax(x, n));
  simd::ScaleRow(y, n, static_cast<float>(1.0 / sum));
}

}  // namespace graphfuse::kernels
