// Checks a kernel's output against the float64 reference under the op's accuracy contract.
#pragma once

#include <span>
#include <string>

#include "graphfuse/ops.h"
#include "graphfuse/tensor.h"

namespace graphfuse {

struct CheckReport {
  bool ok = true;
  int64_t checked = 0;
  int64_t failures = 0;
  double max_ulp_error = 0;     // worst |out - ref| in f32 ulps of ref (finite, nonzero refs)
  double max_contract_ulp = 0;  // worst distance outside the input-slack interval, in f32 ulps
  std::string first_failure;  // "Gelu(-3.5) at element 12 gave ..., expected ..."
};

// Contract: ops with ulp 0 (and all integer ops) match the reference rounded to the output
// dtype bit for bit (NaN matches NaN, the sign of zero counts). Others lie within max_ulp f32
// ulps of the reference interval spanned by moving each float input one f32 ulp (so an
// ill-conditioned argument is not blamed on the kernel), plus half an ulp of the output dtype
// for f16/bf16. A result past the dtype's range may be inf; a result below FLT_MIN in
// magnitude (subnormal) may be flushed to zero. Checks the first `limit` elements (all when limit < 0).
CheckReport CheckAgainstReference(OpKind op, std::span<const TensorView> inputs, const TensorView& out,
                                  const OpAttrs& attrs, int64_t limit = -1);

// Spacing of representable values of `t` near |v| (its ulp there).
double UlpOf(double v, DType t);

}  // namespace graphfuse
