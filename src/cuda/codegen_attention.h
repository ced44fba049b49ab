// What FusedAttention's generated forms share (codegen_attention.cc, codegen_flash.cc): how they
// read the node, and the lines of CUDA C that mask, rope and name. Not a public interface.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ir/schemas/attention_layout.h"
#include "cuda/codegen.h"
#include "cuda/codegen_internal.h"

namespace graphfuse::cuda::internal {

// What both attention forms read off a FusedAttention node: its dimensions and layouts, each
// operand's head access, and the broadcast strides of its masks and RoPE tables.
struct AttentionParts {
  schemas::Dims d;
  schemas::HeadAccess qa{}, ka{}, va{}, oa{};
  bool kt = false;  // K^T laid out [d, Sk] per head
  std::vector<int64_t> ms, bms, cq, ck;
  float scale = 1.f, mask_scale = 1.f;
  std::string kvh;  // the K / V head of query head h: "h", or "(h / G)" for grouped K / V heads
  // The operands' float dtypes (loaded into f32; the scores, softmax and weighted sums are f32)
  // and the output's (rounded once when stored).
  DType q_dt = DType::kF32, k_dt = DType::kF32, v_dt = DType::kF32, mask_dt = DType::kF32;
  DType cos_dt = DType::kF32, sin_dt = DType::kF32, out_dt = DType::kF32;
};

// The node's problem, operands and attributes; refuses the projected form and non-float
// operands (Unimplemented). Errors name `where`.
Result<AttentionParts> ReadAttention(const Node& node, const std::string& where);
// `i0 * <name>0 + i1 * <name>1 + ...` over the nonzero strides, each one a size named `name`
// and its position ("0" when every stride is 0: whether a stride is 0 is the broadcast pattern,
// its value a size).
std::string StridedOffset(KernelSizes& z, const std::string& name, const std::vector<std::string>& index,
                          const std::vector<int64_t>& strides);
// Where row `row` of head (b, `head`) of an operand accessed as `acc` starts: b * <name>_sb +
// head * <name>_sh + row * <name>_sr, the strides sizes.
std::string HeadRow(KernelSizes& z, const std::string& name, const schemas::HeadAccess& acc, const std::string& head,
                    const std::string& row);
// Lines that take `sc` (the scaled score of query row r and key j of head (b, h)) through the
// masks, in the node's order: the f32 mask added (times mask_scale), the bool mask selecting.
std::string AttentionMaskLines(const AttentionParts& a, const std::string& indent, KernelSizes& z);
// "_mask_boolmask"-like: the masks the node's attention applies.
std::string MaskSuffix(const schemas::Dims& d);
// "attention_rope_mask_h32_d128"-like: what the node's attention computes.
std::string AttentionBaseName(const schemas::Dims& d, const std::string& stem);
// Lines that store column c of a roped row into `dst`: x*cos + rotate_half(x)*sin, each
// product rounded, then the add. at(col) reads column `col` of the row as a float; the row's
// index is named `row` in the cos / sin offset, whose broadcast strides are `cs`; its head is
// `head`; the tables' dtypes are cos_dt and sin_dt; the strides are sizes named `cs_name`.
std::string RopedStore(DType cos_dt, DType sin_dt, const std::function<std::string(const std::string&)>& at,
                       const std::vector<int64_t>& cs, const std::string& row, const std::string& dst,
                       const std::string& indent, KernelSizes& z, const std::string& cs_name,
                       const std::string& head = "h");
// The signature's declaration of a read-only operand.
std::string ConstPtr(DType dt, const std::string& name);
// The parameters of a kernel that computes the whole node (q, k, v, [mask], [bool mask],
// [cos, sin], out), without the closing parenthesis (the sizes go after them): the head of the
// one-row and the flash kernels.
std::string WholeNodeParams(const AttentionParts& a);
// The dims the weights fix, as constants (kH, kD, kDv, kHalf); the query rows kS and keys kSk
// follow the sequence lengths: they are sizes (registered in z).
std::string HeadDims(const AttentionParts& a, KernelSizes& z);

}  // namespace graphfuse::cuda::internal
