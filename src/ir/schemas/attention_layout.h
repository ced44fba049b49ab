// How a FusedAttention node's attributes describe its problem (the layouts of Q, K, V and the
// output, sizes, mask and RoPE flags), shared by the op's inference (attention.cc), the
// FuseAttention pass, the CPU kernel (src/cpu/kernels/attention.cc) and the CUDA code generator.
#pragma once

#include <optional>
#include <span>
#include <string>

#include "graphfuse/graph.h"

namespace graphfuse::schemas {

// bshd: [B,S,H,d] order (the pre-head-split tensor, any shape with that order); bhsd: [B,H,S,d]
// heads, also given as [B*H,S,d]; bhds: K^T heads [B,H,d,Sk], also given as [B*H,d,Sk].
enum class Layout { kBSHD, kBHSD, kBHDS };

// The problem as the attributes describe it.
struct Dims {
  int64_t b = 0, h = 0, s = 0, sk = 0, d = 0, dv = 0;
  // K and V heads (attribute kv_heads, default heads): grouped-query attention shares K / V
  // head h / (h / kv_h) among query heads; kv_h divides h.
  int64_t kv_h = 0;
  Layout q = Layout::kBSHD, k = Layout::kBSHD, v = Layout::kBSHD, out = Layout::kBSHD;
  // mask: an f32 mask added (times mask_scale) to the scaled scores (has_mask). mask_select
  // +1 / -1: a bool mask (the input after the f32 one) keeps a score where it is true / false
  // and puts mask_fill in the others (Where(bm, scores, fill) / Where(bm, fill, scores);
  // mask_fill already carries the factors applied after the Where). With both, select_first
  // says the Where comes before the add (Hugging Face's GPT-2 with an attention_mask).
  bool mask = false, rope_q = false, rope_k = false;
  // The values of each head row RoPE rotates (attribute rope_dim: partial rotary, the tables
  // [.., rope_dim]); the head dim by default.
  int64_t rope_dim = 0;
  // rope_interleaved (attribute): RoPE rotates pairs (x[2i], x[2i+1]) (GPT-J). rope_tables_bshd
  // (attribute rope_tables = "bshd"): the tables broadcast over [B,S,H,rope_dim], the RoPE having
  // been applied before the head split's transpose ([B,S,1,r] tables).
  bool rope_interleaved = false, rope_tables_bshd = false;
  int mask_select = 0;
  float mask_fill = 0;
  bool select_first = false;
  // zero_nan_rows (attribute zero_nan_rows = 1): the softmax was followed by Where(IsNaN(P), 0,
  // P), as the exporters and PyTorch's SDPA guard it. A softmax row is NaN exactly when its
  // max is -inf (every key masked to -inf), +inf or NaN; such a row of P becomes zeros, so its
  // output row is 0 . V (0 for finite V) where the plain softmax gives NaN.
  bool zero_nan_rows = false;
  // softcap (attribute softcap, 0: none): logit soft-capping, each scaled score s becomes
  // softcap * tanh(s) before the mask (Gemma 2's c * tanh(s / c): the 1 / c is in `scale`).
  float softcap = 0;
  // The projected form (attribute qkv_proj = 1): the inputs start with x [B*S rows, K] and
  // W [K, (H + 2*KV)*d] in place of q, k, v; q, k and v are x @ W's column blocks (q: H*d
  // columns, k and v: KV*d each, in the order proj_split gives: block proj_split[t] is q, k, v
  // for t = 0, 1, 2), computed head by head inside the kernel (self-attention: S = Sk, d = dv,
  // bshd). With KV < H (grouped-query) the kernel projects each K / V head once for the H / KV
  // query heads reading it.
  bool proj = false;
  int64_t proj_split[3] = {0, 1, 2};
  // The projected form with biases (attribute qkv_bias = 1): the input after W is a bias of
  // (H + 2*KV)*d values ordered as W's columns, added to each projected row (GPT-2's, BERT's,
  // Qwen2's QKV).
  bool proj_bias = false;
  // The projected form with a folded RMSNorm (attribute rms_epsilon, FoldNormIntoGemm): x is
  // the norm's input and W carries its scale; each row's 1/sqrt(mean(x^2) + epsilon) is taken
  // before the heads, and scales the row's q, k and v (before the biases, when there are).
  // Negative: none.
  double rms_eps = -1;
  // The projected form's column blocks: width of q (t = 0), k (1), v (2); where block t starts
  // in W; W's columns in all.
  int64_t proj_width(int t) const { return (t == 0 ? h : kv_h) * d; }
  int64_t proj_offset(int t) const {
    int64_t off = 0;
    for (int u = 0; u < 3; ++u)
      if (proj_split[u] < proj_split[t]) off += proj_width(u);
    return off;
  }
  int64_t proj_cols() const { return (h + 2 * kv_h) * d; }
  Shape out_shape;
  int first_extra() const { return proj ? (proj_bias ? 3 : 2) : 3; }  // the index of mask (or cos)
  int bool_mask_index() const { return first_extra() + (mask ? 1 : 0); }
  int num_inputs() const { return bool_mask_index() + (mask_select != 0 ? 1 : 0) + (rope_q || rope_k ? 2 : 0); }
};

Result<Dims> ReadDims(const AttributeMap& a, const std::string& where);

// The folded RMSNorm's epsilon of a projected attention (Dims::rms_eps), if it has one, and
// setting it: with ReadDims, the only code that names the attribute's key.
std::optional<float> AttentionRmsEpsilon(const AttributeMap& a);
void SetAttentionRmsEpsilon(AttributeMap& a, float epsilon);

// Where head (b, h) of an operand starts and how far apart its rows are. `heads`: the operand's
// heads (d.h for Q and the output, d.kv_h for K and V).
struct HeadAccess {
  int64_t head_stride_b, head_stride_h, row_stride;
};
HeadAccess Access(Layout l, const Dims& d, int64_t heads, int64_t rows, int64_t cols);

// Which float dtypes a check accepts: f32 only (the CPU kernels), or any one float dtype shared
// by every float operand (inference; the CUDA kernels load f16 / bf16 and compute in f32).
enum class AttentionDTypes { kF32, kAnyFloat };

// Checks the node's operands (dtypes and shapes, in input order) against the problem `d`
// describes; inference and the kernel check alike. Errors name `where`.
Status CheckAttentionOperands(const Dims& d, std::span<const DType> dtypes, std::span<const Shape> shapes,
                              const std::string& where, AttentionDTypes accept = AttentionDTypes::kF32);

}  // namespace graphfuse::schemas
