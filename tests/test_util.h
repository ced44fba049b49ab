// Shared helpers for op tests: random inputs, the float64 reference check with ulp tolerance.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "graphfuse/cpu.h"
#include "graphfuse/ops.h"
#include "graphfuse/tensor.h"
#include "ops/check.h"
#include "ops/reference.h"

namespace graphfuse::testing {

// A float's place in the order of all finite floats (monotone integer mapping): the distance
// between two of them counts the representable steps apart, their difference in ulps.
inline int64_t FloatOrdinal(float f) {
  int32_t i;
  std::memcpy(&i, &f, 4);
  return i < 0 ? -static_cast<int64_t>(i & 0x7fffffff) : static_cast<int64_t>(i);
}

// Fills a tensor with values drawn for `op` (inside the op's domain where it has one: positive
// for Log, in (-1, 1) for Asin, above 1 for Acosh; bools for logical inputs), never all zeros.
inline void FillRandom(Tensor& t, OpKind op, int input, std::mt19937& rng) {
  const OpInfo& info = GetOpInfo(op);
  std::uniform_real_distribution<double> any(-4.0, 4.0), pos(0.01, 8.0), base(0.1, 4.0), expo(-3.0, 3.0),
      unit(-0.999, 0.999);
  std::uniform_int_distribution<int> ints(-50, 50), bit(0, 1);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v;
    if (t.dtype() == DType::kBool) v = bit(rng);
    // Integer powers stay inside i32 (50^5 < 2^31); negative exponents truncate toward zero.
    else if (!IsFloat(t.dtype()) && op == OpKind::kPow && input == 1) v = ints(rng) % 6 + (ints(rng) > 40 ? -2 : 0);
    else if (!IsFloat(t.dtype())) v = ints(rng);
    else if (op == OpKind::kLog || op == OpKind::kSqrt || op == OpKind::kRsqrt) v = pos(rng);
    else if (op == OpKind::kAsin || op == OpKind::kAcos || op == OpKind::kAtanh) v = unit(rng);
    else if (op == OpKind::kAcosh) v = 1.0 + pos(rng);
    else if (op == OpKind::kPow) v = input == 0 ? base(rng) : expo(rng);
    else v = any(rng);
    (void)info;
    t.SetFromDouble(i, v);
  }
}

// Checks every element of `out` against the reference (the contract of CheckAgainstReference),
// adds a test failure naming the first bad element, and returns the worst error in ulps
// beyond the input-slack interval (the contract's measure).
inline double ExpectMatchesReference(OpKind op, std::span<const TensorView> in, const Tensor& out,
                                     const OpAttrs& attrs, const std::string& where) {
  const CheckReport rep = CheckAgainstReference(op, in, out.view(), attrs);
  EXPECT_TRUE(rep.ok) << where << ": " << rep.failures << " of " << rep.checked
                      << " elements wrong; first: " << rep.first_failure;
  return rep.max_contract_ulp;
}

}  // namespace graphfuse::testing
