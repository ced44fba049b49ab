// FusedCachedAttention's attributes and inference (attention_cache.h). The attention part is
// FusedAttention's (attention_layout.h): ReadDims and CheckAttentionOperands check it on the
// operands it would read, present_k and present_v in place of k and v.
#include "ir/schemas/attention_cache.h"

#include <vector>

#include "ir/schemas/infer_util.h"
#include "ir/schemas/schema_lists.h"

namespace graphfuse::schemas {

namespace {

Result<Layout> ParseNewRowsLayout(const std::string& s, const std::string& where, const char* which) {
  if (s == "bshd") return Layout::kBSHD;
  if (s == "bhsd") return Layout::kBHSD;
  return InvalidArgument(where, ": ", which, " '", s, "' is not a layout of new K / V rows (bshd, bhsd)");
}

}  // namespace

Result<CacheDims> ReadCacheDims(const AttributeMap& a, const std::string& where) {
  CacheDims c;
  GF_ASSIGN_OR_RETURN(c.att, ReadDims(a, where));
  const Dims& d = c.att;
  if (d.proj || d.k != Layout::kBHSD || d.v != Layout::kBHSD || d.rope_k)
    return InvalidArgument(where, ": the attention over a KV cache reads present K and V as bhsd rows, unprojected "
                                  "and without RoPE of K (rope_new_k ropes the new rows)");
  c.past = AttrInt(a, "past_seq", -1);
  if (c.past < 0 || c.past > d.sk)
    return InvalidArgument(where, ": past_seq ", c.past, " must lie in [0, seq_k = ", d.sk, "]");
  c.rows = d.sk - c.past;
  GF_ASSIGN_OR_RETURN(c.new_k, ParseNewRowsLayout(AttrString(a, "new_k_layout", "bhsd"), where, "new_k_layout"));
  GF_ASSIGN_OR_RETURN(c.new_v, ParseNewRowsLayout(AttrString(a, "new_v_layout", "bhsd"), where, "new_v_layout"));
  c.rope_new_k = AttrInt(a, "rope_new_k", 0) != 0;
  if (c.rope_new_k && !d.rope_q)
    return InvalidArgument(where, ": rope_new_k ropes with the attention's cos / sin, which it reads only with rope_q");
  return c;
}

Shape PresentShape(const CacheDims& c, bool v) {
  return Shape{c.att.b, c.att.kv_h, c.att.sk, v ? c.att.dv : c.att.d};
}

Status CheckCacheOperands(const CacheDims& c, std::span<const DType> dtypes, std::span<const Shape> shapes,
                          const std::string& where, AttentionDTypes accept) {
  const Dims& d = c.att;
  const size_t n = static_cast<size_t>(d.num_inputs() + 2);
  if (shapes.size() != n || dtypes.size() != n)
    return InvalidArgument(where, ": expects ", n, " inputs (q, k_new, v_new, past_k, past_v",
                           d.mask ? ", mask" : "", d.mask_select != 0 ? ", bool mask" : "",
                           d.rope_q ? ", cos, sin" : "", "), got ", shapes.size());
  for (size_t i = 1; i < 5; ++i) {
    if (accept == AttentionDTypes::kF32 && dtypes[i] != DType::kF32)
      return Unimplemented(where, ": this attention kernel runs in f32 only; input ", i, " is ", DTypeName(dtypes[i]));
    if (dtypes[i] != dtypes[0])
      return InvalidArgument(where, ": attention operands share one float dtype; input 0 is ", DTypeName(dtypes[0]),
                             ", input ", i, " is ", DTypeName(dtypes[i]));
  }
  for (int i = 0; i < 4; ++i) {
    const bool v = i % 2 == 1, is_new = i < 2;
    const Shape& s = shapes[static_cast<size_t>(1 + i)];
    const int64_t rows = is_new ? c.rows : c.past, cols = v ? d.dv : d.d;
    const Layout l = is_new ? (v ? c.new_v : c.new_k) : Layout::kBHSD;
    const Shape want{d.b, d.kv_h, rows, cols};
    const bool ok = l == Layout::kBSHD ? Product(s) == d.b * rows * d.kv_h * cols : s == want;
    if (!ok)
      return InvalidArgument(where, ": ", is_new ? "new " : "past ", v ? "V" : "K", " ", ShapeToString(s),
                             " does not hold ",
                             l == Layout::kBSHD ? StrCat("[B,N,KV*d] = [", d.b, ",", rows, ",", d.kv_h * cols, "]")
                                                : ShapeToString(want));
  }
  // The attention's own operands: q, present_k, present_v, then the extras.
  std::vector<DType> att_dtypes = {dtypes[0], dtypes[3], dtypes[4]};
  std::vector<Shape> att_shapes = {shapes[0], PresentShape(c, false), PresentShape(c, true)};
  for (size_t i = CacheDims::kFirstExtra; i < n; ++i) att_dtypes.push_back(dtypes[i]), att_shapes.push_back(shapes[i]);
  GF_RETURN_IF_ERROR(CheckAttentionOperands(d, att_dtypes, att_shapes, where, accept));
  if (c.rope_new_k) {
    const Shape& cos = shapes[n - 2];
    const Shape both[2] = {cos, Shape{d.b, d.kv_h, c.rows, d.d}};
    auto r = BroadcastShapes(both);
    if (cos.size() > 4 || !r.ok() || *r != both[1])
      return InvalidArgument(where, ": cos / sin ", ShapeToString(cos), " do not broadcast to the new K rows ",
                             ShapeToString(both[1]));
  }
  return Status::Ok();
}

namespace {

Result<std::vector<ValueType>> InferCachedAttention(const InferContext& ctx) {
  GF_ASSIGN_OR_RETURN(CacheDims c, ReadCacheDims(ctx.attrs, ctx.Describe()));
  std::vector<DType> dtypes;
  std::vector<Shape> shapes;
  for (const Value* v : ctx.inputs) {
    if (!v) return InvalidArgument(ctx.Describe(), ": FusedCachedAttention takes no omitted inputs");
    dtypes.push_back(v->dtype());
    shapes.push_back(v->shape());
  }
  GF_RETURN_IF_ERROR(CheckCacheOperands(c, dtypes, shapes, ctx.Describe(), AttentionDTypes::kAnyFloat));
  const DType dt = dtypes[0];
  return std::vector<ValueType>{{dt, c.att.out_shape}, {dt, PresentShape(c, false)}, {dt, PresentShape(c, true)}};
}

}  // namespace

std::vector<OpSchema> AttentionCacheSchemas() {
  return {
      {"FusedCachedAttention", 5, 9, 3, InferCachedAttention},  // q, k_new, v_new, past_k, past_v, extras
  };
}

}  // namespace graphfuse::schemas
