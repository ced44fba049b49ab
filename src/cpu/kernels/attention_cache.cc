// FusedCachedAttention (src/ir/schemas/attention_cache.h): the new K / V rows appended to the
// past ones, then the attention over the present rows, in one launch.
//
// present_k and present_v are the node's outputs 1 and 2: per (batch, KV head) the past rows are
// copied, then the new rows are gathered from k_new / v_new in their layout (each new K row roped
// with RopeRow, as Rope computes it, when rope_new_k). The attention then runs as the
// FusedAttention its reference graph holds (the attention over the present rows, with the same
// attributes), through that op's own kernel with present_k / present_v as its k and v.
#include <algorithm>
#include <cstring>
#include <vector>

#include "ir/schemas/attention_cache.h"
#include "kernel_lists.h"
#include "kernel_util.h"
#include "rope_row.h"

namespace graphfuse::kernels {
namespace {

using schemas::Access;
using schemas::CacheDims;
using schemas::HeadAccess;

// The attention over the present rows: the one FusedAttention of the node's reference graph.
Result<const Node*> InnerAttention(const Node& node, const std::string& where) {
  const Graph* ref = node.GetGraph("reference");
  const Node* inner = nullptr;
  if (ref)
    for (const auto& n : ref->nodes())
      if (n->op() == "FusedAttention") {
        if (inner) return InvalidArgument(where, ": its reference graph holds more than one FusedAttention");
        inner = n.get();
      }
  if (!inner)
    return InvalidArgument(where, ": needs a reference graph holding the attention over the present rows "
                                  "(one FusedAttention)");
  return inner;
}

// present[b, h] = past[b, h] rows, then the new rows of head (b, h) (read through `na`), roped
// with cos / sin (strides cs over [B,KV,N,d]) when `cos` is given.
void AppendHead(const CacheDims& c, int64_t b, int64_t h, int64_t cols, const float* past, const float* fresh,
                const HeadAccess& na, const float* cos, const float* sin, const std::vector<int64_t>& cs,
                float* present) {
  const int64_t head = b * c.att.kv_h + h;
  float* dst = present + head * c.att.sk * cols;
  std::memcpy(dst, past + head * c.past * cols, static_cast<size_t>(c.past * cols) * sizeof(float));
  dst += c.past * cols;
  const float* src = fresh + b * na.head_stride_b + h * na.head_stride_h;
  for (int64_t r = 0; r < c.rows; ++r, dst += cols, src += na.row_stride) {
    if (cos) {
      const int64_t off = b * cs[0] + h * cs[1] + r * cs[2];
      RopeRow(src, cos + off, sin + off, cols, dst);
    } else {
      std::memcpy(dst, src, static_cast<size_t>(cols) * sizeof(float));
    }
  }
}

Status CachedAttentionKernel(const KernelContext& ctx) {
  const std::string where = KernelWhere(ctx);
  GF_ASSIGN_OR_RETURN(CacheDims c, schemas::ReadCacheDims(ctx.node.attrs(), where));
  std::vector<DType> dtypes;
  std::vector<Shape> shapes;
  for (const TensorView& t : ctx.inputs) dtypes.push_back(t.dtype), shapes.push_back(t.shape);
  GF_RETURN_IF_ERROR(schemas::CheckCacheOperands(c, dtypes, shapes, where));
  const Shape want[3] = {c.att.out_shape, schemas::PresentShape(c, false), schemas::PresentShape(c, true)};
  if (ctx.outputs.size() != 3) return InvalidArgument(where, ": expects 3 output buffers, got ", ctx.outputs.size());
  for (size_t o = 0; o < 3; ++o)
    if (ctx.outputs[o].dtype != DType::kF32 || ctx.outputs[o].shape != want[o])
      return InvalidArgument(where, ": output buffer ", o, " ", TypeStr(ctx.outputs[o]), " is not f32",
                             ShapeToString(want[o]));
  GF_ASSIGN_OR_RETURN(const Node* inner, InnerAttention(ctx.node, where));
  const CpuKernel* attention = FindCpuKernel("FusedAttention");
  if (!attention) return Internal(where, ": no CPU kernel for FusedAttention");

  const schemas::Dims& d = c.att;
  const float *cos = nullptr, *sin = nullptr;
  std::vector<int64_t> cs;
  if (c.rope_new_k) {
    const size_t at = ctx.inputs.size() - 2;
    if (ctx.inputs[at].shape != ctx.inputs[at + 1].shape)
      return InvalidArgument(where, ": cos ", ShapeToString(ctx.inputs[at].shape), " and sin ",
                             ShapeToString(ctx.inputs[at + 1].shape), " differ in shape");
    cos = ctx.inputs[at].as<const float>(), sin = ctx.inputs[at + 1].as<const float>();
    cs = BroadcastStrides(ctx.inputs[at].shape, Shape{d.b, d.kv_h, c.rows, d.d});
  }
  const HeadAccess ka = Access(c.new_k, d, d.kv_h, c.rows, d.d), va = Access(c.new_v, d, d.kv_h, c.rows, d.dv);
  float* present_k = ctx.outputs[1].as<float>();
  float* present_v = ctx.outputs[2].as<float>();
  const int64_t heads = d.b * d.kv_h;
  const int threads = static_cast<int>(std::min<int64_t>(ctx.cpu.ThreadsFor(heads * d.sk * (d.d + d.dv)), heads));
  ForEachClaimed(ctx.cpu, threads, heads, [&](int64_t head, int) {
    const int64_t b = head / d.kv_h, h = head % d.kv_h;
    AppendHead(c, b, h, d.d, ctx.inputs[3].as<const float>(), ctx.inputs[1].as<const float>(), ka, cos, sin, cs,
               present_k);
    AppendHead(c, b, h, d.dv, ctx.inputs[4].as<const float>(), ctx.inputs[2].as<const float>(), va, nullptr,
               nullptr, cs, present_v);
  });

  // The attention over the present rows: q, present_k, present_v, then the extras.
  std::vector<TensorView> inputs = {ctx.inputs[0], ctx.outputs[1], ctx.outputs[2]};
  for (size_t i = CacheDims::kFirstExtra; i < ctx.inputs.size(); ++i) inputs.push_back(ctx.inputs[i]);
  const KernelContext inner_ctx{*inner, inputs, ctx.outputs.subspan(0, 1), ctx.cpu, nullptr};
  return attention->run(inner_ctx);
}

}  // namespace

std::vector<CpuKernel> AttentionCacheKernels() {
  return {
      {"FusedCachedAttention", CachedAttentionKernel},
  };
}

}  // namespace graphfuse::kernels
