// What the shape ops' inference (shape_ops.cc) and their CPU kernels read alike: Shape's
// start / end, ConstantOfShape's fill value, Constant's tensor and Range's scalars.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "graphfuse/graph.h"

namespace graphfuse::schemas {

// Shape's [start, end) over an input of rank `rank` (negative values count from the end, both
// clamped to [0, rank], end at least start).
std::pair<int64_t, int64_t> ShapeRange(int64_t rank, int64_t start, int64_t end);

// ConstantOfShape's 'value' attribute: a one-element tensor, or null for the default f32 0.
Result<const Tensor*> FillValue(const AttributeMap& attrs, const std::string& where);

// The tensor a Constant node produces, from whichever value attribute it has.
Result<std::shared_ptr<const Tensor>> ConstantValue(const AttributeMap& attrs, const std::string& where);

// Range's scalar inputs: as double for f32, exactly as int64 for i32/i64.
struct RangeArgs {
  double f[3];
  int64_t i[3];
};

// Range's start, limit and delta (each a one-element tensor); errors name `where`.
Result<RangeArgs> ReadRangeArgs(const TensorView (&in)[3], const std::string& where);

}  // namespace graphfuse::schemas
