// Helpers shared by the op schemas' inference (src/ir/schemas/*.cc): type strings for
// messages, dim products, axis normalization, reading shape-like constant inputs and a
// unidirectional broadcast check. The CPU kernels use some of them too.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "graphfuse/dtype.h"
#include "graphfuse/graph.h"
#include "graphfuse/shape.h"
#include "graphfuse/status.h"
#include "graphfuse/tensor.h"
#include "ir/op_registry.h"

namespace graphfuse::schemas {

// "f32[2,3]" for a value, a view or a dtype/shape pair.
inline std::string TypeStr(DType t, const Shape& s) { return StrCat(DTypeName(t), ShapeToString(s)); }
inline std::string TypeStr(const Value* v) { return v ? TypeStr(v->dtype(), v->shape()) : "<omitted>"; }
inline std::string TypeStr(const TensorView& v) { return TypeStr(v.dtype, v.shape); }

inline int64_t Product(const Shape& s, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end && i < s.size(); ++i) n *= s[i];
  return n;
}
inline int64_t Product(const Shape& s) { return Product(s, 0, s.size()); }

// Maps axis in [-rank, rank) to [0, rank); anything else is an error naming the op.
inline Result<int64_t> NormalizeAxis(const InferContext& ctx, int64_t axis, int64_t rank,
                                     const char* what = "axis") {
  if (axis < -rank || axis >= rank)
    return InvalidArgument(ctx.Describe(), ": ", what, " ", axis, " is out of range for rank ", rank,
                           " (valid: [", -rank, ", ", rank - 1, "])");
  return axis < 0 ? axis + rank : axis;
}

// Normalizes a list of axes against `rank`, refusing out-of-range and repeated axes.
inline Result<std::vector<int64_t>> NormalizeAxes(const InferContext& ctx, const std::vector<int64_t>& axes,
                                                  int64_t rank, const char* what = "axes") {
  std::vector<int64_t> out;
  out.reserve(axes.size());
  for (int64_t a : axes) {
    GF_ASSIGN_OR_RETURN(int64_t n, NormalizeAxis(ctx, a, rank, what));
    if (std::find(out.begin(), out.end(), n) != out.end())
      return InvalidArgument(ctx.Describe(), ": ", what, " ", ShapeToString(axes), " repeat axis ", a);
    out.push_back(n);
  }
  return out;
}

// The values of a constant shape-like input (Reshape's shape, Slice's starts, ...). A present but
// non-constant input is refused by ConstInts (Unimplemented: graphfuse shapes are static).
inline Result<std::vector<int64_t>> RequireConstInts(const InferContext& ctx, size_t i, const char* what) {
  const Value* v = ctx.input(i);
  if (v != nullptr && v->dtype() != DType::kI64 && v->dtype() != DType::kI32)
    return InvalidArgument(ctx.Describe(), ": the ", what, " input must be i64 or i32, not ", DTypeName(v->dtype()));
  return ctx.ConstInts(i, what);
}

// Whether `t` broadcasts unidirectionally to `to` (right aligned, each dim 1 or equal).
inline bool BroadcastsTo(const Shape& t, const Shape& to) {
  if (t.size() > to.size()) return false;
  for (size_t k = 0; k < t.size(); ++k) {
    const int64_t a = t[t.size() - 1 - k], b = to[to.size() - 1 - k];
    if (a != 1 && a != b) return false;
  }
  return true;
}

inline bool IsIndexType(DType t) { return t == DType::kI32 || t == DType::kI64; }

}  // namespace graphfuse::schemas
