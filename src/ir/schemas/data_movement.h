// Transpose's permutation and Slice's parameters, shared by their inference (data_movement.cc)
// and the CPU kernels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graphfuse/shape.h"
#include "graphfuse/status.h"

namespace graphfuse::schemas {

// Transpose's perm: `given` when the node has one (`has`; it must permute 0..rank-1), else the
// dims reversed. Errors name `where`.
Result<std::vector<int64_t>> TransposePerm(const std::vector<int64_t>& given, bool has, size_t rank,
                                           const std::string& where);

// What a Slice reads: per input dim its first element and step, and the output shape.
struct SliceParams {
  std::vector<int64_t> start, step;  // per dim of the input
  Shape out;
};

// Slice's parameters for an input of shape `shape` (ONNX clamping, negative starts / ends /
// steps); axes and steps default to 0..n-1 and 1 when absent (has_axes / has_steps false).
Result<SliceParams> ComputeSlice(const Shape& shape, const std::vector<int64_t>& starts,
                                 const std::vector<int64_t>& ends, std::vector<int64_t> axes,
                                 std::vector<int64_t> steps, bool has_axes, bool has_steps, const std::string& where);

}  // namespace graphfuse::schemas
