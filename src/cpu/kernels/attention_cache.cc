// FusedCachedAttention (src/ir/schemas/attention_cache.h): the new K / V rows appended to the
// past ones, then the attention over the present rows, in one launch.
//
// present_k and present_v are the node's outputs 1 and 2: per (batch, KV head) the past rows are
// copied (unless present is past's own buffer: a KV cache kept in place, see InPlace), then the
// new rows are gathered from k_new / v_new in their layout (each new K row roped with RopeRow,
// as Rope computes it, when rope_new_k). The attention then runs through FusedAttention's own
// kernel with present_k / present_v as its k and v, on a FusedAttention node made from the
// node's own attributes (the attention over the present rows, as the op defines it): the node's
// reference graph is not read, so a plan may leave it out (Target::ReadsReferenceGraphs).
#include <algorithm>
#include <cstring>
#include <vector>

#include "ir/schemas/attention_cache.h"
#include "cpu/kernels/kernel_lists.h"
#include "cpu/kernels/kernel_util.h"
#include "cpu/kernels/rope_row.h"

namespace graphfuse::kernels {
namespace {

using schemas::Access;
using schemas::CacheDims;
using schemas::HeadAccess;

// The attention over the present rows as a FusedAttention node of a graph of its own: inputs q,
// present_k, present_v, then the node's extras (constants shared where the node's are
// constants, so that the attention kernel sees a constant mask as such), and the node's
// attributes but the cache's. Made once per plan (the kernel's prepare), or per run without one.
struct InnerAttention {
  std::shared_ptr<Graph> graph;
  const Node* node = nullptr;
};

Result<std::shared_ptr<const InnerAttention>> MakeInnerAttention(const Node& node) {
  if (node.inputs().size() < static_cast<size_t>(CacheDims::kFirstExtra) || node.outputs().size() != 3)
    return InvalidArgument(node.Describe(), ": expects q, k_new, v_new, past_k, past_v and 3 outputs");
  auto inner = std::make_shared<InnerAttention>();
  inner->graph = std::make_shared<Graph>(node.name() + ".attention");
  Graph& g = *inner->graph;
  std::vector<Value*> inputs;
  auto add = [&](const std::string& name, const Value* v) -> Status {
    if (!v) return InvalidArgument(node.Describe(), ": attention operand '", name, "' is omitted");
    auto in = v->constant() ? g.AddConstant(name, v->constant()) : g.AddInput(name, v->dtype(), v->shape());
    if (!in.ok()) return in.status().WithContext(node.Describe());
    inputs.push_back(*in);
    return Status::Ok();
  };
  GF_RETURN_IF_ERROR(add("q", node.input(0)));
  GF_RETURN_IF_ERROR(add("present_k", node.output(1)));
  GF_RETURN_IF_ERROR(add("present_v", node.output(2)));
  for (size_t i = CacheDims::kFirstExtra; i < node.inputs().size(); ++i)
    GF_RETURN_IF_ERROR(add(StrCat("extra", i), node.input(i)));
  AttributeMap attrs = node.attrs();
  for (const char* key : {"past_seq", "new_k_layout", "new_v_layout", "rope_new_k", "reference", "kernel_name"})
    attrs.erase(key);
  auto made = g.AddNode("FusedAttention", inputs, std::move(attrs), node.name());
  if (!made.ok()) return made.status().WithContext(StrCat(node.Describe(), ": its attention over the present rows"));
  inner->node = *made;
  return std::shared_ptr<const InnerAttention>(std::move(inner));
}

Result<std::shared_ptr<const void>> PrepareCachedAttention(const Node& node, const PrepareOptions&) {
  GF_ASSIGN_OR_RETURN(std::shared_ptr<const InnerAttention> inner, MakeInnerAttention(node));
  return std::shared_ptr<const void>(std::move(inner));
}

// Where the heads of a [B,KV,rows,cols] operand lie: a contiguous view's, or a strided view's
// own (its last dim contiguous: a KV cache kept in a buffer of larger capacity).
Result<HeadAccess> CacheAccess(const TensorView& t, int64_t kv_h, int64_t rows, int64_t cols, const std::string& what,
                               const std::string& where) {
  if (t.strides.empty()) return HeadAccess{kv_h * rows * cols, rows * cols, cols};
  if (t.strides.size() != 4 || (t.strides[3] != 1 && cols > 1) || t.strides[2] < cols)
    return InvalidArgument(where, ": ", what, " is a view with strides ", ShapeToString(t.strides),
                           "; a KV cache view needs whole rows, its last dim contiguous");
  return HeadAccess{t.strides[0], t.strides[1], t.strides[2]};
}

// present[b, h] = past[b, h] rows, then the new rows of head (b, h) (read through `na`), roped
// with cos / sin (strides cs over [B,KV,N,d]) when `cos` is given. With `in_place` the past
// rows already lie where present's first rows are (one buffer), and only the new rows are written.
void AppendHead(const CacheDims& c, int64_t b, int64_t h, int64_t cols, const float* past, const HeadAccess& pa,
                const float* fresh, const HeadAccess& na, const float* cos, const float* sin,
                const std::vector<int64_t>& cs, float* present, const HeadAccess& oa, bool in_place) {
  float* dst = present + b * oa.head_stride_b + h * oa.head_stride_h;
  if (!in_place) {
    const float* src = past + b * pa.head_stride_b + h * pa.head_stride_h;
    if (pa.row_stride == cols && oa.row_stride == cols) {
      std::memcpy(dst, src, static_cast<size_t>(c.past * cols) * sizeof(float));
    } else {
      for (int64_t r = 0; r < c.past; ++r)
        std::memcpy(dst + r * oa.row_stride, src + r * pa.row_stride, static_cast<size_t>(cols) * sizeof(float));
    }
  }
  dst += c.past * oa.row_stride;
  const float* src = fresh + b * na.head_stride_b + h * na.head_stride_h;
  for (int64_t r = 0; r < c.rows; ++r, dst += oa.row_stride, src += na.row_stride) {
    if (cos) {
      const int64_t off = b * cs[0] + h * cs[1] + r * cs[2];
      RopeRow(src, cos + off, sin + off, cols, dst);
    } else {
      std::memcpy(dst, src, static_cast<size_t>(cols) * sizeof(float));
    }
  }
}

// Whether `present` holds `past` in place: the same buffer, heads and rows the same distance
// apart, so its first P rows of each head are the past ones. Any other overlap is refused: the
// copy would read rows it had already overwritten.
Result<bool> InPlace(const TensorView& past, const HeadAccess& pa, const TensorView& present, const HeadAccess& oa,
                     const CacheDims& c, int64_t cols, const std::string& what, const std::string& where) {
  if (c.past == 0) return false;
  if (past.data == present.data && pa.head_stride_b == oa.head_stride_b && pa.head_stride_h == oa.head_stride_h &&
      pa.row_stride == oa.row_stride)
    return true;
  auto span = [&](const TensorView& t, const HeadAccess& a, int64_t rows) {
    const float* lo = t.as<const float>();
    const int64_t last = (c.att.b - 1) * a.head_stride_b + (c.att.kv_h - 1) * a.head_stride_h + (rows - 1) * a.row_stride +
                         cols;
    return std::pair<const float*, const float*>(lo, lo + last);
  };
  const auto [p0, p1] = span(past, pa, c.past);
  const auto [o0, o1] = span(present, oa, c.past + c.rows);
  if (p0 < o1 && o0 < p1)
    return InvalidArgument(where, ": present ", what, " overlaps past ", what, " but not as the same rows of one "
                           "buffer (a view of the past's buffer with the same strides)");
  return false;
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
  std::shared_ptr<const InnerAttention> made_here;
  const auto* inner = static_cast<const InnerAttention*>(ctx.state);
  if (!inner) {
    GF_ASSIGN_OR_RETURN(made_here, MakeInnerAttention(ctx.node));
    inner = made_here.get();
  }
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
  GF_ASSIGN_OR_RETURN(const HeadAccess pka, CacheAccess(ctx.inputs[3], d.kv_h, c.past, d.d, "past K", where));
  GF_ASSIGN_OR_RETURN(const HeadAccess pva, CacheAccess(ctx.inputs[4], d.kv_h, c.past, d.dv, "past V", where));
  GF_ASSIGN_OR_RETURN(const HeadAccess oka, CacheAccess(ctx.outputs[1], d.kv_h, d.sk, d.d, "present K", where));
  GF_ASSIGN_OR_RETURN(const HeadAccess ova, CacheAccess(ctx.outputs[2], d.kv_h, d.sk, d.dv, "present V", where));
  GF_ASSIGN_OR_RETURN(const bool k_in_place, InPlace(ctx.inputs[3], pka, ctx.outputs[1], oka, c, d.d, "K", where));
  GF_ASSIGN_OR_RETURN(const bool v_in_place, InPlace(ctx.inputs[4], pva, ctx.outputs[2], ova, c, d.dv, "V", where));
  float* present_k = ctx.outputs[1].as<float>();
  float* present_v = ctx.outputs[2].as<float>();
  const int64_t heads = d.b * d.kv_h;
  const int64_t moved_rows = (k_in_place && v_in_place ? 0 : c.past) + c.rows;
  const int threads = static_cast<int>(std::min<int64_t>(ctx.cpu.ThreadsFor(heads * moved_rows * (d.d + d.dv)), heads));
  ForEachClaimed(ctx.cpu, threads, heads, [&](int64_t head, int) {
    const int64_t b = head / d.kv_h, h = head % d.kv_h;
    AppendHead(c, b, h, d.d, ctx.inputs[3].as<const float>(), pka, ctx.inputs[1].as<const float>(), ka, cos, sin, cs,
               present_k, oka, k_in_place);
    AppendHead(c, b, h, d.dv, ctx.inputs[4].as<const float>(), pva, ctx.inputs[2].as<const float>(), va, nullptr,
               nullptr, cs, present_v, ova, v_in_place);
  });

  // The attention over the present rows: q, present_k, present_v, then the extras.
  std::vector<TensorView> inputs = {ctx.inputs[0], ctx.outputs[1], ctx.outputs[2]};
  for (size_t i = CacheDims::kFirstExtra; i < ctx.inputs.size(); ++i) inputs.push_back(ctx.inputs[i]);
  const KernelContext inner_ctx{*inner->node, inputs, ctx.outputs.subspan(0, 1), ctx.cpu, nullptr};
  return attention->run(inner_ctx);
}

}  // namespace

std::vector<CpuKernel> AttentionCacheKernels() {
  return {
      // past K / V (inputs 3, 4) and present K / V (outputs 1, 2) may be strided views: a KV
      // cache kept in one buffer of larger capacity, present over past's rows (written in place).
      {.op = "FusedCachedAttention", .run = CachedAttentionKernel, .prepare = PrepareCachedAttention,
       .strided_inputs = 1u << 3 | 1u << 4,
       .strided_outputs = 1u << 1 | 1u << 2},
  };
}

}  // namespace graphfuse::kernels
