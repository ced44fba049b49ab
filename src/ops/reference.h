// The float64 reference for every elementwise op: the row's expression evaluated with
// T = double (T = int64_t when the data is integer), element by element, with broadcasting.
// Slow and obviously correct; tests and `--check` compare every kernel against it.
#pragma once

#include <span>
#include <vector>

#include "graphfuse/ops.h"
#include "graphfuse/tensor.h"

namespace graphfuse {

// One element: x, y, z are the op's inputs (unused ones ignored), idx the output element index.
double ReferenceScalar(OpKind kind, double x, double y, double z, const OpAttrs& a, int64_t idx);
int64_t ReferenceScalarInt(OpKind kind, int64_t x, int64_t y, int64_t z, const OpAttrs& a, int64_t idx);

// Whether `kind` on these input dtypes computes in the integer domain.
bool ComputesInIntegers(OpKind kind, std::span<const DType> inputs);

// Whether a fused group must round an op's result in its registers to hold what the unfused op
// stores: f16 / bf16 results (registers are f32), and i32 results of integer arithmetic
// (registers are int64: a sum or product past 2^31 wraps when stored). A Cast rounds itself.
bool NeedsRoundingStep(OpKind kind, DType out, bool integer_domain);

// The whole op over broadcast inputs; the values are exact results before rounding to the
// output dtype (integer results are exact up to 2^53).
Result<std::vector<double>> ReferenceOp(OpKind kind, std::span<const TensorView> inputs, const OpAttrs& a);

}  // namespace graphfuse
