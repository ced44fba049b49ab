// Output comparison shared by `run` and `bench`: numpy.allclose's test, |got - want| <= atol +
// rtol * |want| per element (NaN matches NaN; equal values match, infinities included), with
// the largest errors for the report.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "graphfuse/tensor.h"

namespace graphfuse::cli {

// The defaults of --rtol / --atol for `run` and `bench`.
inline constexpr double kDefaultRtol = 1e-4, kDefaultAtol = 1e-5;

// The default tolerance (relative and absolute) of a model computed in bf16 or f16 against its
// f32 plan: the README's accuracy contract.
inline double NarrowTolerance(DType t) { return t == DType::kBF16 ? 5e-2 : 1e-2; }

// The default tolerance (relative and absolute) of an f32 model whose GEMMs run in TF32 (`run
// --tf32`) against the CPU's f32 plan: TF32 keeps a 10-bit mantissa of each GEMM operand
// (relative rounding 2^-11), so a GEMM's error is about 1e-3 of the sum of |products| and
// grows through the layers that follow.
inline constexpr double kTf32Tolerance = 1e-2;

struct OutputReport {
  std::string name;
  double max_abs = 0, max_rel = 0;  // over finite errors
  int64_t mismatches = 0;
  bool compared = false, ok = true;
};

inline OutputReport Compare(const std::string& name, const Tensor& got, const Tensor& want, double rtol, double atol) {
  OutputReport r;
  r.name = name;
  r.compared = true;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.GetAsDouble(i), w = want.GetAsDouble(i);
    if (std::isnan(g) && std::isnan(w)) continue;
    const double abs_err = std::fabs(g - w);
    if (!(abs_err <= atol + rtol * std::fabs(w)) && !(g == w)) ++r.mismatches;
    if (std::isfinite(abs_err)) {
      r.max_abs = std::max(r.max_abs, abs_err);
      if (w != 0) r.max_rel = std::max(r.max_rel, abs_err / std::fabs(w));
    }
  }
  r.ok = r.mismatches == 0;
  return r;
}

}  // namespace graphfuse::cli
