// One row of rotate-half RoPE, y = x * c + rotate_half(x) * s over d (even) f32 values, each
// element computed as (x * c) + ((-x2) * s) with every product rounded on its own (the library
// builds with -ffp-contract=off): the value the decomposed Mul / Neg / Concat / Mul / Add graph
// gives, lane for lane. y may be x (both halves of a pair are loaded before either is stored)
// and must not overlap it otherwise. Shared by Rope (rope.cc) and FusedAttention's Q / K rows
// (attention.cc), so that the two agree bit for bit.
#pragma once

#include <cstdint>

#include "cpu/simd.h"

namespace graphfuse::kernels {

// RopeRowScaled: the same on x * pre (each element rounded), in the same pass: what scaling
// the row first and then RopeRow give, bit for bit (FusedAttention's folded RMSNorm).
template <bool kPre>
inline void RopeRowImpl(const float* x, const float* c, const float* s, int64_t d, float* y, float pre) {
  using simd::kLanes;
  using simd::VF;
  const int64_t h = d / 2;
  const VF vpre(pre);
  int64_t i = 0;
  for (; i + kLanes <= h; i += kLanes) {
    VF x1 = VF::Load(x + i), x2 = VF::Load(x + i + h);
    if constexpr (kPre) x1 = x1 * vpre, x2 = x2 * vpre;
    const VF a = x1 * VF::Load(c + i);
    const VF b = (-x2) * VF::Load(s + i);
    const VF a2 = x2 * VF::Load(c + i + h);
    const VF b2 = x1 * VF::Load(s + i + h);
    (a + b).Store(y + i);
    (a2 + b2).Store(y + i + h);
  }
  for (; i < h; ++i) {
    const float x1 = kPre ? x[i] * pre : x[i], x2 = kPre ? x[i + h] * pre : x[i + h];
    y[i] = x1 * c[i] + (-x2) * s[i];
    y[i + h] = x2 * c[i + h] + x1 * s[i + h];
  }
}

inline void RopeRow(const float* x, const float* c, const float* s, int64_t d, float* y) {
  RopeRowImpl<false>(x, c, s, d, y, 1.f);
}
inline void RopeRowScaled(const float* x, const float* c, const float* s, int64_t d, float* y, float pre) {
  RopeRowImpl<true>(x, c, s, d, y, pre);
}

// Interleaved rotary (GPT-J): pairs (x[2i], x[2i+1]) rotate, y[2i] = x[2i] * c[2i] + (-x[2i+1]) *
// s[2i], y[2i+1] = x[2i+1] * c[2i+1] + x[2i] * s[2i+1], over the first r values (tables of r
// values, each angle's twice); the other d - r pass through (times pre, when kPre). Each product
// rounded on its own, as the decomposed graph (stack of -x_odd, x_even) computes it.
template <bool kPre>
inline void RopeRowInterleavedImpl(const float* x, const float* c, const float* s, int64_t r, int64_t d, float* y,
                                   float pre) {
  for (int64_t i = 0; i + 1 < r; i += 2) {
    const float x0 = kPre ? x[i] * pre : x[i], x1 = kPre ? x[i + 1] * pre : x[i + 1];
    y[i] = x0 * c[i] + (-x1) * s[i];
    y[i + 1] = x1 * c[i + 1] + x0 * s[i + 1];
  }
  if (y != x || kPre)
    for (int64_t i = r; i < d; ++i) y[i] = kPre ? x[i] * pre : x[i];
}

// Partial rotary (GPT-NeoX, Phi): the first r of d values rotated with tables of r values, the
// other d - r passed through (times pre, when scaled).
inline void RopeRowPartial(const float* x, const float* c, const float* s, int64_t r, int64_t d, float* y) {
  RopeRowImpl<false>(x, c, s, r, y, 1.f);
  if (y != x)
    for (int64_t i = r; i < d; ++i) y[i] = x[i];
}
inline void RopeRowPartialScaled(const float* x, const float* c, const float* s, int64_t r, int64_t d, float* y,
                                 float pre) {
  RopeRowImpl<true>(x, c, s, r, y, pre);
  for (int64_t i = r; i < d; ++i) y[i] = x[i] * pre;
}

// One row as a node describes it: rotate-half or interleaved pairs, over the first r of d values
// (scaled: of x * pre).
inline void RopeRowOf(bool interleaved, const float* x, const float* c, const float* s, int64_t r, int64_t d,
                      float* y) {
  if (interleaved) RopeRowInterleavedImpl<false>(x, c, s, r, d, y, 1.f);
  else RopeRowPartial(x, c, s, r, d, y);
}
inline void RopeRowOfScaled(bool interleaved, const float* x, const float* c, const float* s, int64_t r, int64_t d,
                            float* y, float pre) {
  if (interleaved) RopeRowInterleavedImpl<true>(x, c, s, r, d, y, pre);
  else RopeRowPartialScaled(x, c, s, r, d, y, pre);
}

}  // namespace graphfuse::kernels
