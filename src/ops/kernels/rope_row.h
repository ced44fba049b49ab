// One row of rotate-half RoPE, y = x * c + rotate_half(x) * s over d (even) f32 values, each
// element computed as (x * c) + ((-x2) * s) with every product rounded on its own (the library
// builds with -ffp-contract=off): the value the decomposed Mul / Neg / Concat / Mul / Add graph
// gives, lane for lane. y must not overlap x. Shared by Rope (rope.cc) and FusedAttention's
// gathered Q / K rows (attention.cc), so that the two agree bit for bit.
#pragma once

#include <cstdint>

#include "cpu/simd.h"

namespace graphfuse::kernels {

inline void RopeRow(const float* x, const float* c, const float* s, int64_t d, float* y) {
  using simd::kLanes;
  using simd::VF;
  const int64_t h = d / 2;
  int64_t i = 0;
  for (; i + kLanes <= h; i += kLanes) {
    const VF a = VF::Load(x + i) * VF::Load(c + i);
    const VF b = (-VF::Load(x + i + h)) * VF::Load(s + i);
    (a + b).Store(y + i);
    const VF a2 = VF::Load(x + i + h) * VF::Load(c + i + h);
    const VF b2 = VF::Load(x + i) * VF::Load(s + i + h);
    (a2 + b2).Store(y + i + h);
  }
  for (; i < h; ++i) {
    const float a = x[i] * c[i];
    const float b = (-x[i + h]) * s[i];
    y[i] = a + b;
    const float a2 = x[i + h] * c[i + h];
    const float b2 = x[i] * s[i + h];
    y[i + h] = a2 + b2;
  }
}

}  // namespace graphfuse::kernels
