// FusedAttention: softmax(scale * Q K^T + mask_scale * mask) V for every (batch, head) pair in
// ONE launch, formed by the FuseAttention pass (src/passes/fuse_attention.cc). A bool mask
// selects instead (mask_select, attention_layout.h): scores where it keeps them, mask_fill elsewhere.
//
// Operands are read where they lie, through a per-operand layout attribute:
//   "bshd": the pre-head-split tensor [B,S,H*d] (any shape with that row-major order); head
//           (b, h) starts at b*S*H*d + h*d and its rows are H*d apart.
//   "bhsd": a head-split tensor [B,H,S,d] (or [B*H,S,d]); head (b, h) is a contiguous [S,d] block.
//   "bhds": (K only) K^T already laid out [B,H,d,Sk] (or [B*H,d,Sk]); head (b, h) is a
//           contiguous [d,Sk] block.
// The projected form (qkv_proj) reads x and W instead, and each task projects its heads' q, k
// and v into scratch, adding the qkv bias when the node has one. Its unit is a K / V head with
// the R = heads / kv_heads query heads reading it ([q_0 .. q_{R-1}, k, v] side by side in the
// scratch; R = 1 without grouped-query attention), so a K / V head is projected once.
// The output is written in "bshd" ([B,S,H*dv], what Transpose+Reshape of the heads gives) or
// "bhsd" ([B,H,S,dv]) order. Optional inputs follow q, k, v in this order: mask (when
// has_mask; broadcast to [B,H,S,Sk]), cos and sin (when rope_q or rope_k; broadcast to
// [B,H,S,d], last dim d), y = x*cos + rotate_half(x)*sin applied to Q / K rows as they are
// gathered.
//
// Per task: a block of query rows of one head. scores = scale * Q K^T is one sgemm into
// per-thread scratch ([rows, Sk]; Q and K are read in place unless RoPE needs a gathered copy;
// the projected form ropes its scratch's Q and K in place),
// the mask is added and each row exponentiated after subtracting its max (as softmax.cc does),
// then O = P V is one sgemm reading V in place and writing O in place in the output layout;
// O's rows are divided by their softmax sums last ([rows, dv] values rather than [rows, Sk];
// P's rows before the product when Sk < dv).
// No [B,H,S,Sk] tensor and no transposed copy ever exists in memory. The keys a constant mask
// drops from every row of a block (a causal mask's future) are left out of both products when
// nothing there can reach the output (KeyTailSkippable, MaskExpRow).
//
// Grouped-query attention (kv_heads < heads): query head h reads K / V head h / (heads /
// kv_heads), where the K / V operands hold kv_heads heads.
//
// Each sgemm runs on its task's thread (sgemm.h): the (batch, head, row block) tasks are what
// is split over graphfuse's pool. The masked softmax rows are in attention_mask.cc; the
// attributes' reading and the inference in src/ir/schemas/attention.cc.
#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "cpu/simd.h"
#include "cpu/kernels/attention_mask.h"
#include "ir/schemas/attention_layout.h"
#include "cpu/kernels/kernel_lists.h"
#include "cpu/kernels/kernel_util.h"
#include "cpu/kernels/norm_rows.h"
#include "cpu/kernels/packed_gemm.h"
#include "cpu/kernels/sgemm.h"
#include "cpu/kernels/softmax_row.h"
#include "cpu/kernels/rope_row.h"

namespace graphfuse::kernels {
namespace {

using schemas::Access;
using schemas::Dims;
using schemas::HeadAccess;
using schemas::Layout;
using schemas::ReadDims;

using simd::kLanes;
using simd::VF;

// dst[r] = rope(src row r) for `rows` rows of d values, the first `rot` rotated; cos/sin rows are
// located through broadcast strides (c_row: element stride between rows; the last dim is
// contiguous).
void GatherRope(bool interleaved, const float* src, int64_t src_stride, int64_t rows, int64_t rot, int64_t d,
                const float* cos, const float* sin, int64_t c_row, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    RopeRowOf(interleaved, src + r * src_stride, cos + r * c_row, sin + r * c_row, rot, d, dst + r * d);
}

// What a plan prepares once: the constant mask's rows, and for the projected form each
// unit's q, k and v columns of W gathered into one [K, (R+2)d] matrix and packed
// (packed_gemm.h).
struct AttentionState {
  std::optional<MaskRows> mask;
  std::vector<std::shared_ptr<const PackedGemm>> heads;  // projected form, per group of units:
                                                          // [S, K] @ [K, (R+2)d*G], m = S
  int64_t rows = 0;                                       // S, the m the heads were packed for
};

// The projected form's unit: a K / V head and the R query heads reading it. Slot i of unit u
// is query head u*R + i (i < R), then K head u (i = R), then V head u (i = R + 1).
int64_t QueryHeadsPerKv(const Dims& d) { return d.h / d.kv_h; }
int64_t UnitSlots(const Dims& d) { return QueryHeadsPerKv(d) + 2; }

// Where slot `slot` of unit `unit` begins among W's columns (and the bias's): the column
// blocks of q, k and v ordered by qkv_split, each head d columns wide.
int64_t SlotColumn(const Dims& d, int64_t unit, int64_t slot) {
  const int64_t r = QueryHeadsPerKv(d);
  if (slot < r) return d.proj_offset(0) + (unit * r + slot) * d.d;
  return d.proj_offset(slot == r ? 1 : 2) + unit * d.d;
}

// Units per task of the projected form (G). Weights of a unit over 1 MiB stream through the
// caches on every GEMM call; a task then projects G units in one call and ropes them back to
// back while they are still in cache. G divides KV, leaves at least four tasks per batch, and
// keeps the task's [S, (R+2)d*G] within an eighth of L2, since a wider group slows the GEMM
// itself.
int64_t HeadGroup(const Dims& d, int64_t k) {
  const int64_t unit = UnitSlots(d) * d.d;
  if (k * unit * 4 <= (1 << 20)) return 1;
  int64_t g = 1;
  for (int64_t c = 2; c <= d.kv_h / 4; ++c)
    if (d.kv_h % c == 0 && d.s * unit * c * 4 <= L2Bytes() / 8) g = c;
  return g;
}

// The projection weights PrepareAttention packs: constant f32 [K, proj_cols], else nullptr.
const Value* PackedProjectionWeights(const Node& node, const Dims& d) {
  const Value* w = d.proj && node.inputs().size() > 1 ? node.input(1) : nullptr;
  if (w && w->constant() && w->dtype() == DType::kF32 && w->shape().size() == 2 && d.s > 0 && d.d > 0 &&
      w->shape()[0] > 0 && w->shape()[1] == d.proj_cols())
    return w;
  return nullptr;
}

Result<std::shared_ptr<const void>> PrepareAttention(const Node& node, const PrepareOptions& options) {
  GF_ASSIGN_OR_RETURN(Dims d, ReadDims(node.attrs(), node.Describe()));
  auto state = std::make_shared<AttentionState>();
  state->mask = PrepareMaskRows(node, d);
  if (const Value* w = PackedProjectionWeights(node, d)) {
    const int64_t k = w->shape()[0], ldw = d.proj_cols(), group = HeadGroup(d, k), slots = UnitSlots(d);
    const int64_t wg = slots * d.d * group;
    const float* wp = w->constant()->data_as<float>();
    std::vector<float> cols;  // unit by unit: its slots' columns (gathered only to be packed)
    for (int64_t u0 = 0; u0 < d.kv_h; u0 += group) {
      auto gather = [&]() -> const float* {
        cols.resize(static_cast<size_t>(k * wg));
        for (int64_t r = 0; r < k; ++r)
          for (int64_t g = 0; g < group; ++g)
            for (int64_t i = 0; i < slots; ++i)
              std::memcpy(cols.data() + r * wg + (g * slots + i) * d.d, wp + r * ldw + SlotColumn(d, u0 + g, i),
                          static_cast<size_t>(d.d) * sizeof(float));
        return cols.data();
      };
      // One block of all the group's columns, so that a task projects its units in one GEMM
      // call (narrower blocks run slower).
      PackedGemmOptions po = PackOptionsFor(options, *w->constant(),
                                            StrCat("attention units ", u0, "+", group, " of ", slots, "x", d.d,
                                                   " columns (", d.h, " heads, ", d.kv_h, " kv; q, k, v from ",
                                                   d.proj_offset(0), ", ", d.proj_offset(1), ", ", d.proj_offset(2),
                                                   " of ", ldw, ")"));
      po.block_cols = wg;
      po.lazy_b = gather;
      GF_ASSIGN_OR_RETURN(auto packed, PackedGemm::Create(d.s, k, wg, nullptr, wg, wg, {}, po));
      state->heads.push_back(std::move(packed));
    }
    state->rows = d.s;
  }
  if (!state->mask && state->heads.empty()) return std::shared_ptr<const void>();
  return std::shared_ptr<const void>(std::move(state));
}

std::string DescribeAttention(const Node& node, const PrepareOptions& options) {
  auto d = ReadDims(node.attrs(), node.Describe());
  if (!d.ok()) return "";
  const std::string products = StrCat("scores and weighted values: ", kActivationGemms);
  const Value* w = PackedProjectionWeights(node, *d);
  if (!w) return products;
  const int64_t k = w->shape()[0], group = HeadGroup(*d, k), wg = UnitSlots(*d) * d->d * group;
  return StrCat("projections: ", d->kv_h / group, " GEMMs per sequence, each ",
                DescribePackedGemm(d->s, k, wg, options), "; ", products);
}

// One launch: the problem, where its operands lie, and how it is cut into tasks. Built once
// per launch (BindOperands, then PlanTasks); the steps below only read it.
struct AttentionLaunch {
  const CpuContext* cpu = nullptr;
  Dims d;
  float scale = 1.f, mask_scale = 1.f;
  // The operands. The projected form reads x and W where q, k and v would be (they are null then).
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  float* out = nullptr;
  const float* mask = nullptr;  // the f32 mask
  std::vector<int64_t> ms;      // its strides over [B,H,S,Sk]
  const uint8_t* bmask = nullptr;  // the bool mask that selects
  std::vector<int64_t> bms;        // its strides over [B,H,S,Sk]
  const MaskRows* mask_rows = nullptr;  // the constant mask's rows as prepared, when they are this mask's
  bool rows_of_bool = false;            // mask_rows describe the bool mask (else the f32 one)
  const float *cos = nullptr, *sin = nullptr;
  std::vector<int64_t> cq, ck;  // cos/sin strides over [B,H,S,d] and [B,H,Sk,d]
  HeadAccess qa{}, ka{}, va{}, oa{};
  // The tasks: blocks of query rows of one head (or groups of heads, projected), and each
  // task's scratch: [scores | gathered roped Q | gathered roped K | projected q, k, v].
  int64_t rows_per_block = 0, blocks = 0, items = 0;
  int64_t scores_floats = 0, qg_floats = 0, kg_floats = 0, qkv_floats = 0;
  size_t scratch_bytes = 0;
  int64_t work_per_item = 0;
  // The projected form: x [B*S, K] and W [K, (H + 2*KV)*d]; a task computes `group` units
  // (HeadGroup), each `wu` = (R+2)d columns of its scratch rows.
  const float *x = nullptr, *w = nullptr;
  int64_t kx = 0, group = 1, wu = 0, wg = 0, tasks = 0;
  const AttentionState* state = nullptr;
  bool packed_heads = false;       // the state holds W packed per group of heads for this S
  const uint16_t* x_bf16 = nullptr;  // x rounded to bf16 once, when the packed heads read A in bf16
  const float* inv_rms = nullptr;  // a folded RMSNorm's 1/rms per row of x (RowInvRms)
  const float* qkv_bias = nullptr;  // the projected form's biases, ordered as W's columns
};

// The operands (checked as inference checks them), the output buffer and the BLAS int range.
Status CheckBuffers(const KernelContext& ctx, const Dims& d, const std::string& where) {
  std::vector<DType> dtypes;
  std::vector<Shape> shapes;
  for (const TensorView& t : ctx.inputs) dtypes.push_back(t.dtype), shapes.push_back(t.shape);
  GF_RETURN_IF_ERROR(schemas::CheckAttentionOperands(d, dtypes, shapes, where));
  if (ctx.outputs[0].shape != d.out_shape || ctx.outputs[0].dtype != DType::kF32)
    return InvalidArgument(where, ": output buffer ", TypeStr(ctx.outputs[0]), " is not f32",
                           ShapeToString(d.out_shape));
  for (int64_t x : {d.s, d.sk, d.d, d.dv, d.h * d.d, d.h * d.dv})
    if (x > INT_MAX) return Unimplemented(where, ": a GEMM dimension of ", x, " exceeds the BLAS int range");
  return Status::Ok();
}

// Where the operands lie: q, k, v (or x, W), the masks and the RoPE tables with their broadcast
// strides, each head's access, and the prepared mask rows when they describe this mask.
Result<AttentionLaunch> BindOperands(const KernelContext& ctx, const Dims& d, const std::string& where) {
  AttentionLaunch a;
  a.cpu = &ctx.cpu;
  a.d = d;
  a.scale = ctx.node.GetFloat("scale", 1.f);
  a.mask_scale = ctx.node.GetFloat("mask_scale", 1.f);
  a.out = ctx.outputs[0].as<float>();
  if (d.proj) {
    a.x = ctx.inputs[0].as<const float>();
    a.w = ctx.inputs[1].as<const float>();
    if (d.proj_bias) a.qkv_bias = ctx.inputs[2].as<const float>();
  } else {
    a.q = ctx.inputs[0].as<const float>();
    a.k = ctx.inputs[1].as<const float>();
    a.v = ctx.inputs[2].as<const float>();
  }
  size_t next = static_cast<size_t>(d.first_extra());
  if (d.mask) {
    a.mask = ctx.inputs[next].as<const float>();
    a.ms = BroadcastStrides(ctx.inputs[next].shape, Shape{d.b, d.h, d.s, d.sk});
    ++next;
  }
  if (d.mask_select != 0) {
    a.bmask = static_cast<const uint8_t*>(ctx.inputs[next].data);
    a.bms = BroadcastStrides(ctx.inputs[next].shape, Shape{d.b, d.h, d.s, d.sk});
    ++next;
  }
  a.state = static_cast<const AttentionState*>(ctx.state);
  a.mask_rows = a.state && a.state->mask ? &*a.state->mask : nullptr;
  a.rows_of_bool = d.mask_select != 0;
  const std::vector<int64_t>& prepared_strides = a.rows_of_bool ? a.bms : a.ms;
  if (a.mask_rows && (prepared_strides.empty() || prepared_strides[3] != 1 || a.mask_rows->sk != d.sk ||
                      a.mask_rows->numel != ctx.inputs[RowsMaskIndex(d)].numel()))
    a.mask_rows = nullptr;
  if (d.rope_q || d.rope_k) {
    a.cos = ctx.inputs[next].as<const float>();
    a.sin = ctx.inputs[next + 1].as<const float>();
    if (ctx.inputs[next].shape != ctx.inputs[next + 1].shape)
      return InvalidArgument(where, ": cos ", ShapeToString(ctx.inputs[next].shape), " and sin ",
                             ShapeToString(ctx.inputs[next + 1].shape), " differ in shape");
    if (d.rope_tables_bshd) {  // [B,S,H,r] strides, read in (b, h, s, c) order
      const std::vector<int64_t> q = BroadcastStrides(ctx.inputs[next].shape, Shape{d.b, d.s, d.h, d.rope_dim});
      const std::vector<int64_t> k = BroadcastStrides(ctx.inputs[next].shape, Shape{d.b, d.sk, d.kv_h, d.rope_dim});
      a.cq = {q[0], q[2], q[1], q[3]};
      a.ck = {k[0], k[2], k[1], k[3]};
    } else {
      a.cq = BroadcastStrides(ctx.inputs[next].shape, Shape{d.b, d.h, d.s, d.rope_dim});
      a.ck = BroadcastStrides(ctx.inputs[next].shape, Shape{d.b, d.kv_h, d.sk, d.rope_dim});
    }
  }
  a.qa = Access(d.q, d, d.h, d.s, d.d), a.ka = Access(d.k, d, d.kv_h, d.sk, d.d);
  a.va = Access(d.v, d, d.kv_h, d.sk, d.dv), a.oa = Access(d.out, d, d.h, d.s, d.dv);
  // FusedCachedAttention hands on its present K / V as they are: strided views of a KV cache
  // kept in a buffer of larger capacity ([B,KV,Sk,d] heads, whole rows).
  for (int t = 1; t <= 2 && !d.proj; ++t) {
    const TensorView& x = ctx.inputs[static_cast<size_t>(t)];
    if (x.strides.empty()) continue;
    const int64_t cols = t == 1 ? d.d : d.dv;
    if ((t == 1 ? d.k : d.v) != Layout::kBHSD || x.strides.size() != 4 || (x.strides[3] != 1 && cols > 1))
      return InvalidArgument(where, ": ", t == 1 ? "K" : "V", " is a view with strides ", ShapeToString(x.strides),
                             "; only [B,KV,Sk,d] heads with whole rows are read strided");
    (t == 1 ? a.ka : a.va) = HeadAccess{x.strides[0], x.strides[1], x.strides[2]};
  }
  return a;
}

// Cuts the launch into tasks and sizes their scratch. A block of query rows is a [rows, Sk]
// score block of about 256 KiB (L2-resident), 16..256 rows: sgemm runs well below its rate on
// fewer rows. With a constant mask (one MaskRows can describe) that fits in one such block, two
// blocks: the first then leaves out the keys its rows all drop (a causal mask's later half).
// The blocks follow from the node alone, prepared or not: the same blocks give the same bits.
void PlanTasks(const KernelContext& ctx, AttentionLaunch& a) {
  const Dims& d = a.d;
  const size_t prepared_index = RowsMaskIndex(d);
  const Value* prepared_input = ctx.node.inputs().size() > prepared_index ? ctx.node.input(prepared_index) : nullptr;
  const bool constant_mask = (d.mask || d.mask_select != 0) && prepared_input && prepared_input->constant();
  const int64_t base_rows = std::min<int64_t>(d.s, std::clamp<int64_t>(65536 / std::max<int64_t>(d.sk, 1), 16, 256));
  a.rows_per_block = constant_mask && d.s >= 64 ? std::min(base_rows, (d.s / 2 + 15) / 16 * 16) : base_rows;
  a.blocks = (d.s + a.rows_per_block - 1) / a.rows_per_block;
  a.items = d.b * d.h * a.blocks;
  auto align16 = [](int64_t n) { return (n + 15) / 16 * 16; };
  a.scores_floats = align16(a.rows_per_block * d.sk);
  a.qg_floats = d.rope_q && !d.proj ? align16(a.rows_per_block * d.d) : 0;  // gathered copies
  a.kg_floats = d.rope_k && !d.proj ? align16(d.sk * d.d) : 0;
  a.kx = d.proj ? ctx.inputs[0].shape.back() : 0;  // the projection's K
  a.group = d.proj ? HeadGroup(d, a.kx) : 1;
  a.wu = d.proj ? UnitSlots(d) * d.d : 0;
  a.wg = a.wu * a.group;
  a.qkv_floats = d.proj ? align16(d.s * a.wg) : 0;  // the projected form's heads
  a.scratch_bytes =
      static_cast<size_t>(a.scores_floats + a.qg_floats + a.kg_floats + a.qkv_floats + 16) * sizeof(float);
  // The projection's share per query head: its q, and its part of the unit's k and v.
  a.work_per_item = a.rows_per_block * d.sk * (d.d + d.dv) / 4 + a.rows_per_block * d.sk * 8 +
                    (d.proj ? a.rows_per_block * a.wu / QueryHeadsPerKv(d) * a.kx / 4 : 0);
  a.tasks = d.proj ? d.b * d.kv_h / a.group : 0;
  a.packed_heads = d.proj && a.state && static_cast<int64_t>(a.state->heads.size()) == d.kv_h / a.group &&
                   a.state->rows == d.s;
}

// One block of query rows of one head: rows [r0, r0 + rows) of head `head` (batch b, head h,
// reading K / V head kvh). The head's q, k and v rows start at q, k, v and lie lq, lk, lv floats
// apart (q already at row r0); o is the block's first output row.
struct HeadBlock {
  int64_t head = 0, b = 0, h = 0, kvh = 0, r0 = 0, rows = 0;
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t lq = 0, lk = 0, lv = 0;
  float* o = nullptr;
};

HeadBlock MakeHeadBlock(const AttentionLaunch& a, int64_t head, int64_t blk, const float* qb, int64_t lq,
                        const float* kb, int64_t lk, const float* vb, int64_t lv) {
  HeadBlock hb;
  hb.head = head, hb.b = head / a.d.h, hb.h = head % a.d.h, hb.kvh = hb.h / (a.d.h / a.d.kv_h);
  hb.r0 = blk * a.rows_per_block, hb.rows = std::min(a.rows_per_block, a.d.s - hb.r0);
  hb.q = qb + hb.r0 * lq, hb.k = kb, hb.v = vb;
  hb.lq = lq, hb.lk = lk, hb.lv = lv;
  hb.o = a.out + hb.b * a.oa.head_stride_b + hb.h * a.oa.head_stride_h + hb.r0 * a.oa.row_stride;
  return hb;
}

// Where row r of the block reads the f32 mask and the bool mask, and its row of MaskRows.
int64_t MaskOffset(const AttentionLaunch& a, const HeadBlock& hb, int64_t r) {
  return a.mask ? hb.b * a.ms[0] + hb.h * a.ms[1] + (hb.r0 + r) * a.ms[2] : int64_t{0};
}
int64_t BoolMaskOffset(const AttentionLaunch& a, const HeadBlock& hb, int64_t r) {
  return a.bmask ? hb.b * a.bms[0] + hb.h * a.bms[1] + (hb.r0 + r) * a.bms[2] : int64_t{0};
}
size_t PreparedRow(const AttentionLaunch& a, const HeadBlock& hb, int64_t r) {
  return static_cast<size_t>((a.rows_of_bool ? BoolMaskOffset(a, hb, r) : MaskOffset(a, hb, r)) / a.d.sk);
}

// Q and K as the score product reads them (rows lda / ldb apart).
struct ScoreOperands {
  const float* q;
  int64_t lda;
  const float* k;
  int64_t ldb;
};

// The block's Q and its head's K, roped into the scratch (qg, kg) when RoPE applies and they
// do not hold it already (`roped`: the projected form ropes them in place); else read in place.
// gathered_head names the K head (b * kv_h + kvh) whose roped K is in kg: the blocks of one
// head, and the query heads sharing a K head, gather it once.
ScoreOperands RopedOperands(const AttentionLaunch& a, const HeadBlock& hb, bool roped, float* qg, float* kg,
                            int64_t& gathered_head) {
  const Dims& d = a.d;
  ScoreOperands op{hb.q, hb.lq, hb.k, hb.lk};
  if (d.rope_q && !roped) {
    const int64_t off = hb.b * a.cq[0] + hb.h * a.cq[1] + hb.r0 * a.cq[2];
    GatherRope(d.rope_interleaved, hb.q, hb.lq, hb.rows, d.rope_dim, d.d, a.cos + off, a.sin + off, a.cq[2], qg);
    op.q = qg;
    op.lda = d.d;
  }
  if (d.rope_k && !roped) {
    const int64_t k_head = hb.b * d.kv_h + hb.kvh;
    if (gathered_head != k_head) {
      const int64_t off = hb.b * a.ck[0] + hb.kvh * a.ck[1];
      GatherRope(d.rope_interleaved, hb.k, hb.lk, d.sk, d.rope_dim, d.d, a.cos + off, a.sin + off, a.ck[2], kg);
      gathered_head = k_head;
    }
    op.k = kg;
    op.ldb = d.d;
  }
  return op;
}

// P V sums its keys in chunks of this many, in order (WeightedValues), and a block that leaves
// keys out computes a whole number of chunks (ComputedKeys). The sgemm blocks its K dimension by
// K's size (oneDNN's AVX2 kernels do), so a product over fewer keys is not the first part of
// the product over all of them; chunk by chunk it is, and a chunk of keys the mask dropped
// adds exact zeros: leaving keys out gives the bits of doing every key on every CPU.
constexpr int64_t kKeyChunk = 128;

// The keys the block computes: [0, Sk), or [0, kend) when the constant mask (MaskRows) drops
// keys [kend, Sk) from every row of the block and nothing there can reach the output
// (KeyTailSkippable, which sets score_bound for MaskExpRow). kend is a whole number of key
// chunks.
int64_t ComputedKeys(const AttentionLaunch& a, const HeadBlock& hb, const ScoreOperands& op, double& score_bound) {
  const Dims& d = a.d;
  if (!a.mask_rows) return d.sk;
  int64_t top = 0;
  for (int64_t r = 0; r < hb.rows; ++r) top = std::max(top, a.mask_rows->live[PreparedRow(a, hb, r)]);
  top = std::min(d.sk, (top + kKeyChunk - 1) / kKeyChunk * kKeyChunk);
  if (top < d.sk && KeyTailSkippable(d, a.rows_of_bool, std::abs(a.scale), op.q, op.lda, hb.rows, op.k, op.ldb, hb.v,
                                     hb.lv, top, score_bound))
    return top;
  return d.sk;
}

// scores[rows, kend] = scale * Q K^T (K^T read as given for bhds), rows Sk apart; soft-capped
// (softcap * tanh) when the node says so.
void ScoreProduct(const AttentionLaunch& a, const HeadBlock& hb, const ScoreOperands& op, int64_t kend,
                  float* scores) {
  const Dims& d = a.d;
  if (d.d == 0) {
    for (int64_t r = 0; r < hb.rows; ++r) std::fill(scores + r * d.sk, scores + r * d.sk + kend, 0.f);
    return;
  }
  {
    const ScopedNs blas_time(BlasCounter(*a.cpu));
    Sgemm(false, d.k != Layout::kBHDS, hb.rows, kend, d.d, a.scale, op.q, op.lda, op.k, op.ldb, 0.f, scores, d.sk);
  }
  if (d.softcap != 0.f)  // soft-capping, before the mask
    for (int64_t r = 0; r < hb.rows; ++r)
      for (float* x = scores + r * d.sk; x < scores + r * d.sk + kend; ++x) *x = d.softcap * std::tanh(*x);
}

// The block's scores over keys [0, kend), masked and exponentiated row by row (MaskExpRow);
// inv[r] = 1 / row r's sum. Under zero_nan_rows a NaN row (every key masked to -inf, or a NaN
// or +inf score) becomes zeros with inv[r] = 0, as the guard the pass absorbed gives. When a
// row's live scores turn out too small for the keys left out (MaskExpRow returns -1), the
// whole block is computed again with every key. Returns the keys computed.
int64_t SoftmaxScores(const AttentionLaunch& a, const HeadBlock& hb, const ScoreOperands& op, int64_t kend,
                      double score_bound, float* scores, float* inv) {
  const Dims& d = a.d;
  for (;;) {
    ScoreProduct(a, hb, op, kend, scores);
    bool whole = true;
    for (int64_t r = 0; r < hb.rows && whole; ++r) {
      const int64_t moff = MaskOffset(a, hb, r), boff = BoolMaskOffset(a, hb, r);
      const size_t mrow = PreparedRow(a, hb, r);
      const int64_t live = a.mask_rows ? a.mask_rows->live[mrow] : d.sk;
      const float bound = a.mask_rows ? a.mask_rows->bound[mrow] : 0.f;
      const int64_t zeros = a.mask_rows && !a.rows_of_bool ? a.mask_rows->zeros[mrow] : 0;
      const SelectMask sel{a.bmask + boff, a.bmask ? a.bms[3] : 1, d.mask_select > 0, d.select_first, d.mask_fill};
      const double sum = MaskExpRow(scores + r * d.sk, d.sk, a.mask ? a.mask + moff : nullptr, a.mask ? a.ms[3] : 1,
                                    a.mask_scale, zeros, live, bound, a.bmask ? &sel : nullptr, kend, score_bound);
      whole = sum != -1.0;  // (a NaN row returns NaN)
      inv[r] = static_cast<float>(1.0 / sum);
      if (d.zero_nan_rows && sum != sum) {
        // The guard Where(IsNaN(P), 0, P): this row of P is zeros, and its output 0 . V.
        std::fill(scores + r * d.sk, scores + r * d.sk + kend, 0.f);
        inv[r] = 0.f;
      }
    }
    if (whole || kend == d.sk) return kend;
    kend = d.sk;
  }
}

// O[rows, dv] = P V over keys [0, kend), written in place in the output layout, each row
// divided by its softmax sum (inv). The rows are normalized on the smaller side: P's
// [rows, kend] before the product when Sk < dv (decode, and LLaMA-7B's 128-wide heads at
// S = 32: a quarter of the multiplies there), else O's [rows, dv] after it. The choice follows
// from the node's shapes, so prepared and unprepared runs agree.
void WeightedValues(const AttentionLaunch& a, const HeadBlock& hb, int64_t kend, float* scores, const float* inv) {
  const Dims& d = a.d;
  auto scale_rows = [&](float* x, int64_t ld, int64_t n) {
    for (int64_t r = 0; r < hb.rows; ++r) simd::ScaleRow(x + r * ld, n, inv[r]);
  };
  const bool normalize_p = d.sk < d.dv;
  if (normalize_p) scale_rows(scores, d.sk, kend);
  if (d.dv == 0) return;
  {
    const ScopedNs blas_time(BlasCounter(*a.cpu));
    for (int64_t k0 = 0; k0 < std::max<int64_t>(kend, 1); k0 += kKeyChunk)  // kKeyChunk: why chunks
      Sgemm(false, false, hb.rows, d.dv, std::min(kKeyChunk, kend - k0), 1.f, scores + k0, d.sk, hb.v + k0 * hb.lv,
            hb.lv, k0 == 0 ? 0.f : 1.f, hb.o, a.oa.row_stride);
  }
  if (!normalize_p) scale_rows(hb.o, a.oa.row_stride, d.dv);
}

// One block of query rows of one head, through the task's scratch: Q and K roped if needed,
// the keys to compute, the masked softmax of the scores, then P V.
void RunBlock(const AttentionLaunch& a, const HeadBlock& hb, bool roped, float* scratch, int64_t& gathered_head) {
  float* scores = scratch;
  float* qg = scratch + a.scores_floats;
  float* kg = qg + a.qg_floats;
  const ScoreOperands op = RopedOperands(a, hb, roped, qg, kg, gathered_head);
  double score_bound = 0;
  const int64_t kend = ComputedKeys(a, hb, op, score_bound);
  float inv[256];
  const int64_t computed = SoftmaxScores(a, hb, op, kend, score_bound, scores, inv);
  WeightedValues(a, hb, computed, scores, inv);
}

// Items [begin, end) of the plain form: item = (head, block of query rows), q, k and v read in
// place.
void RunItems(const AttentionLaunch& a, int64_t begin, int64_t end, float* scratch) {
  const Dims& d = a.d;
  int64_t gathered_head = -1;
  for (int64_t item = begin; item < end; ++item) {
    const ScopedNs task_time(TaskCounter(*a.cpu));
    const int64_t head = item / a.blocks, blk = item % a.blocks;
    const int64_t b = head / d.h, h = head % d.h, kvh = h / (d.h / d.kv_h);
    const HeadBlock hb = MakeHeadBlock(a, head, blk, a.q + b * a.qa.head_stride_b + h * a.qa.head_stride_h,
                                       a.qa.row_stride, a.k + b * a.ka.head_stride_b + kvh * a.ka.head_stride_h,
                                       a.ka.row_stride, a.v + b * a.va.head_stride_b + kvh * a.va.head_stride_h,
                                       a.va.row_stride);
    RunBlock(a, hb, false, scratch, gathered_head);
  }
}

// The projected form's q, k and v of units [u0, u0 + group) of batch b: x's rows of the batch
// (xb) times the units' columns of W, into qkv ([S, (R+2)d*G], each row the group's slots side
// by side).
void ProjectHeads(const AttentionLaunch& a, int64_t u0, const float* xb, const uint16_t* xb_bf16, float* qkv) {
  const Dims& d = a.d;
  const ScopedNs blas_time(BlasCounter(*a.cpu));
  if (a.packed_heads) {
    const PackedGemm& g = *a.state->heads[static_cast<size_t>(u0 / a.group)];
    for (int64_t blk = 0; blk < g.blocks(); ++blk) g.RunBlock(blk, xb, qkv, {}, xb_bf16);
  } else if (a.kx == 0) {
    std::fill(qkv, qkv + d.s * a.wg, 0.f);
  } else {
    for (int64_t g = 0; g < a.group; ++g)
      for (int64_t i = 0; i < UnitSlots(d); ++i)
        Sgemm(false, false, d.s, d.d, a.kx, 1.f, xb, a.kx, a.w + SlotColumn(d, u0 + g, i), d.proj_cols(), 0.f,
              qkv + g * a.wu + i * d.d, a.wg);
  }
}

// The projected form's biases added to the units' q, k and v row by row, after the product as
// the GEMM's epilogue would add them (so before RoPE). With a folded RMSNorm too, each row is
// first scaled by its 1/rms here (the bias follows the norm), and RoPE then scales nothing.
void AddHeadBiases(const AttentionLaunch& a, int64_t b, int64_t u0, float* qkv) {
  if (!a.qkv_bias) return;
  const Dims& d = a.d;
  for (int64_t r = 0; r < d.s; ++r) {
    const float c = a.inv_rms ? a.inv_rms[b * d.s + r] : 1.f;
    for (int64_t g = 0; g < a.group; ++g)
      for (int64_t i = 0; i < UnitSlots(d); ++i) {
        float* x = qkv + r * a.wg + g * a.wu + i * d.d;
        const float* bias = a.qkv_bias + SlotColumn(d, u0 + g, i);
        if (a.inv_rms) simd::ScaleRow(x, d.d, c);
        for (int64_t j = 0; j < d.d; ++j) x[j] += bias[j];
      }
  }
}

// RoPE in place, row by row through the scratch: one sequential sweep over what the GEMM just
// wrote, rather than a strided gather per head into a copy. A folded RMSNorm (without biases,
// which AddHeadBiases scales before) scales each row of q, k and v by its row's 1/rms in the
// same sweep (x W' = y W / (1/rms)), q and k inside RoPE.
void RopeHeadsInPlace(const AttentionLaunch& a, int64_t b, int64_t u0, float* qkv) {
  const Dims& d = a.d;
  const float* inv_rms = a.qkv_bias ? nullptr : a.inv_rms;
  if (!d.rope_q && !d.rope_k && !inv_rms) return;
  const int64_t per_kv = QueryHeadsPerKv(d);
  for (int64_t r = 0; r < d.s; ++r) {
    float* row = qkv + r * a.wg;
    const float c = inv_rms ? inv_rms[b * d.s + r] : 1.f;
    for (int64_t g = 0; g < a.group; ++g) {
      const int64_t u = u0 + g;
      float* ur = row + g * a.wu;
      for (int64_t i = 0; i <= per_kv; ++i) {  // the query heads, then k
        float* x = ur + i * d.d;
        const bool is_q = i < per_kv;
        const bool rope = is_q ? d.rope_q : d.rope_k;
        const std::vector<int64_t>& cs = is_q ? a.cq : a.ck;
        const int64_t off = rope ? b * cs[0] + (is_q ? u * per_kv + i : u) * cs[1] + r * cs[2] : 0;
        if (rope && inv_rms) RopeRowOfScaled(d.rope_interleaved, x, a.cos + off, a.sin + off, d.rope_dim, d.d, x, c);
        else if (rope) RopeRowOf(d.rope_interleaved, x, a.cos + off, a.sin + off, d.rope_dim, d.d, x);
        else if (inv_rms) simd::ScaleRow(x, d.d, c);
      }
      if (inv_rms) simd::ScaleRow(ur + (per_kv + 1) * d.d, d.d, c);  // v
    }
  }
}

// A task of the projected form: a group of units of one batch (HeadGroup). Their q, k and v
// are computed into the task's scratch, where RoPE, the scores and P V then read them: they
// never go to memory, nor to another core.
void RunProjectedHeads(const AttentionLaunch& a, int64_t task, float* scratch) {
  const Dims& d = a.d;
  const ScopedNs task_time(TaskCounter(*a.cpu));
  const int64_t per_kv = QueryHeadsPerKv(d);
  const int64_t b = task / (d.kv_h / a.group), u0 = task % (d.kv_h / a.group) * a.group;
  float* qkv = scratch + a.scores_floats + a.qg_floats + a.kg_floats;
  ProjectHeads(a, u0, a.x + b * d.s * a.kx, a.x_bf16 ? a.x_bf16 + b * d.s * a.kx : nullptr, qkv);
  AddHeadBiases(a, b, u0, qkv);
  RopeHeadsInPlace(a, b, u0, qkv);
  for (int64_t g = 0; g < a.group; ++g) {
    const float* unit = qkv + g * a.wu;
    for (int64_t i = 0; i < per_kv; ++i) {
      int64_t gathered_head = -1;
      for (int64_t blk = 0; blk < a.blocks; ++blk)
        RunBlock(a,
                 MakeHeadBlock(a, b * d.h + (u0 + g) * per_kv + i, blk, unit + i * d.d, a.wg, unit + per_kv * d.d,
                               a.wg, unit + (per_kv + 1) * d.d, a.wg),
                 true, scratch, gathered_head);
    }
  }
}

// A folded RMSNorm's 1/rms per row of x, as RMSNorm computes it (norm_rows.h), before the heads
// (every task reads every row).
std::vector<float> RowInvRms(const AttentionLaunch& a, int threads) {
  const Dims& d = a.d;
  const int64_t rows = d.b * d.s;
  std::vector<float> inv(static_cast<size_t>(rows));
  auto row_inv = [&](int64_t r) {
    inv[static_cast<size_t>(r)] = InvRms(RowSumSquaresD(a.x + r * a.kx, a.kx), std::max<int64_t>(a.kx, 1), d.rms_eps);
  };
  if (a.cpu->pool == nullptr || threads <= 1) {
    for (int64_t r = 0; r < rows; ++r) row_inv(r);
  } else {  // a few claims per thread: a claim per row cost more than the row's sum
    const int64_t per = std::max<int64_t>(1, rows / (4 * threads)), claims = (rows + per - 1) / per;
    ForEachClaimed(*a.cpu, threads, claims, [&](int64_t c, int) {
      const ScopedNs task_time(TaskCounter(*a.cpu));
      for (int64_t r = c * per; r < std::min(rows, (c + 1) * per); ++r) row_inv(r);
    });
  }
  return inv;
}

// Runs every task: on the calling thread, or spread over `threads` pool threads, each with its
// own scratch.
void RunTasks(const AttentionLaunch& a, int threads) {
  const CpuContext& cpu = *a.cpu;
  if (cpu.pool == nullptr || threads <= 1) {
    std::unique_ptr<float[]> local;
    float* scratch = nullptr;
    if (cpu.pool) {
      scratch = static_cast<float*>(cpu.pool->Scratch(0, a.scratch_bytes));
    } else {
      local.reset(new float[a.scratch_bytes / sizeof(float)]);
      scratch = local.get();
    }
    if (a.d.proj) {
      for (int64_t task = 0; task < a.tasks; ++task) RunProjectedHeads(a, task, scratch);
    } else {
      RunItems(a, 0, a.items, scratch);
    }
    return;
  }
  if (a.d.proj) {  // groups of heads claimed one at a time (a late thread takes fewer)
    ForEachClaimed(cpu, threads, a.tasks, [&](int64_t task, int tid) {
      RunProjectedHeads(a, task, static_cast<float*>(cpu.pool->Scratch(tid, a.scratch_bytes)));
    });
    return;
  }
  // Contiguous item ranges per task, so consecutive blocks of one head reuse its gathered K.
  cpu.pool->Parallel(threads, [&](int tid, int nt) {
    const int64_t b = a.items * tid / nt, e = a.items * (tid + 1) / nt;
    if (b < e) RunItems(a, b, e, static_cast<float*>(cpu.pool->Scratch(tid, a.scratch_bytes)));
  });
}

Status AttentionKernel(const KernelContext& ctx) {
  const std::string where = KernelWhere(ctx);
  GF_ASSIGN_OR_RETURN(Dims d, ReadDims(ctx.node.attrs(), where));
  GF_RETURN_IF_ERROR(CheckBuffers(ctx, d, where));
  float* out = ctx.outputs[0].as<float>();
  if (d.b * d.h * d.s * d.dv == 0) return Status::Ok();
  if (d.sk == 0) {  // softmax over zero keys is empty: P V sums nothing
    std::fill(out, out + d.b * d.h * d.s * d.dv, 0.f);
    return Status::Ok();
  }
  GF_ASSIGN_OR_RETURN(AttentionLaunch a, BindOperands(ctx, d, where));
  PlanTasks(ctx, a);
  const int threads =
      static_cast<int>(std::min<int64_t>(ctx.cpu.ThreadsFor(a.items * a.work_per_item), d.proj ? a.tasks : a.items));
  std::vector<float> inv_rms;
  if (d.proj && d.rms_eps >= 0) {
    inv_rms = RowInvRms(a, threads);
    a.inv_rms = inv_rms.data();
  }
  // Every group of heads of a batch projects the same rows of x: rounded to bf16 once here,
  // not by each group's GEMM.
  thread_local std::vector<uint16_t> x_bf16;
  if (a.packed_heads && a.state->heads[0]->ReadsA16()) {
    x_bf16.resize(static_cast<size_t>(d.b * d.s * a.kx));
    PackedGemm::ToBF16(a.x, d.b * d.s * a.kx, x_bf16.data());
    a.x_bf16 = x_bf16.data();
  }
  RunTasks(a, threads);
  return Status::Ok();
}

}  // namespace

std::vector<CpuKernel> AttentionKernels() {
  return {
      {"FusedAttention", AttentionKernel, PrepareAttention, DescribeAttention},
  };
}

}  // namespace graphfuse::kernels
