// Transpose's permutation and the parameters of Slice, GatherND / ScatterND and Pad, shared by
// their inference (data_movement.cc) and the CPU kernels.
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

// GatherND's shape rules (ScatterND's updates are the same slices, batch_dims 0): data of rank
// r, indices of rank q whose last dim m in [1, r - batch_dims] indexes data's dims from
// batch_dims on; the leading batch_dims dims of both agree.
struct GatherNDParams {
  int64_t batch_dims = 0;
  int64_t m = 0;  // indices.shape[-1]
  Shape out;      // indices.shape[:-1] + data.shape[batch_dims + m:]
};
Result<GatherNDParams> ComputeGatherND(const Shape& data, const Shape& indices, int64_t batch_dims,
                                       const std::string& where);

// Pad's parameters: per dim of the input the count padded before it (negative: cropped) and
// the output shape. pads holds the begins then the ends of `axes` (all dims when !has_axes).
enum class PadMode { kConstant, kReflect, kEdge, kWrap };
struct PadParams {
  PadMode mode = PadMode::kConstant;
  std::vector<int64_t> begin;
  Shape out;
};
Result<PadParams> ComputePad(const Shape& shape, const std::vector<int64_t>& pads, std::vector<int64_t> axes,
                             bool has_axes, const std::string& mode, const std::string& where);

// The input index that output index o of a dim reads: o - begin inside [0, n), else by the mode
// (edge: the nearest end; wrap: modulo n; reflect: mirrored without repeating the ends, as
// numpy's "reflect"), or kPadFill for the constant.
inline constexpr int64_t kPadFill = -1;
int64_t PadSource(int64_t o, int64_t begin, int64_t n, PadMode mode);

}  // namespace graphfuse::schemas
