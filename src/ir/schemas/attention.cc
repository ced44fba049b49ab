// FusedAttention: softmax(scale * Q K^T + mask_scale * mask) V for every (batch, head) pair,
// formed by the FuseAttention pass (src/passes/fuse_attention.cc): how its attributes describe
// the problem (attention_layout.h) and its inference. The CPU kernel is in
// src/cpu/kernels/attention.cc.
#include "ir/schemas/attention_layout.h"

#include <climits>
#include <set>
#include <vector>

#include "ir/schemas/infer_util.h"
#include "ir/schemas/schema_lists.h"

namespace graphfuse::schemas {

namespace {

// The folded RMSNorm's attribute of the projected form (Dims::rms_eps).
constexpr char kRmsEpsilon[] = "rms_epsilon";

Result<Layout> ParseLayout(const std::string& s, bool allow_bhds, const std::string& where, const char* which) {
  if (s == "bshd") return Layout::kBSHD;
  if (s == "bhsd") return Layout::kBHSD;
  if (s == "bhds" && allow_bhds) return Layout::kBHDS;
  return InvalidArgument(where, ": ", which, " '", s, "' is not a layout this op reads (bshd, bhsd",
                         allow_bhds ? ", bhds" : "", ")");
}

}  // namespace

Result<Dims> ReadDims(const AttributeMap& a, const std::string& where) {
  Dims d;
  d.b = AttrInt(a, "batch", -1);
  d.h = AttrInt(a, "heads", -1);
  d.s = AttrInt(a, "seq_q", -1);
  d.sk = AttrInt(a, "seq_k", -1);
  d.d = AttrInt(a, "head_dim", -1);
  d.dv = AttrInt(a, "v_head_dim", d.d);
  for (int64_t x : {d.b, d.h, d.s, d.sk, d.d, d.dv})
    if (x < 0)
      return InvalidArgument(where, ": needs non-negative batch, heads, seq_q, seq_k, head_dim, v_head_dim attributes");
  d.kv_h = AttrInt(a, "kv_heads", d.h);
  if (d.h > 0 ? d.kv_h <= 0 || d.h % d.kv_h != 0 : d.kv_h != 0)
    return InvalidArgument(where, ": kv_heads ", d.kv_h, " must divide heads ", d.h);
  GF_ASSIGN_OR_RETURN(d.q, ParseLayout(AttrString(a, "q_layout", "bshd"), false, where, "q_layout"));
  GF_ASSIGN_OR_RETURN(d.k, ParseLayout(AttrString(a, "k_layout", "bshd"), true, where, "k_layout"));
  GF_ASSIGN_OR_RETURN(d.v, ParseLayout(AttrString(a, "v_layout", "bshd"), false, where, "v_layout"));
  GF_ASSIGN_OR_RETURN(d.out, ParseLayout(AttrString(a, "out_layout", "bshd"), false, where, "out_layout"));
  d.mask = AttrInt(a, "has_mask", 0) != 0;
  d.mask_select = static_cast<int>(AttrInt(a, "mask_select", 0));
  if (d.mask_select < -1 || d.mask_select > 1)
    return InvalidArgument(where, ": mask_select must be 0 (additive mask), 1 or -1 (bool mask kept where true / false)");
  d.mask_fill = static_cast<float>(AttrFloat(a, "mask_fill", 0.f));
  d.select_first = AttrInt(a, "mask_select_first", 0) != 0;
  d.zero_nan_rows = AttrInt(a, "zero_nan_rows", 0) != 0;
  d.softcap = static_cast<float>(AttrFloat(a, "softcap", 0.f));
  d.rope_q = AttrInt(a, "rope_q", 0) != 0;
  d.rope_k = AttrInt(a, "rope_k", 0) != 0;
  if (d.rope_k && d.k == Layout::kBHDS)
    return InvalidArgument(where, ": RoPE on K needs K rows (k_layout bshd or bhsd), not bhds");
  d.rope_dim = AttrInt(a, "rope_dim", d.d);
  d.rope_interleaved = AttrInt(a, "rope_interleaved", 0) != 0;
  const std::string tables = AttrString(a, "rope_tables", "bhsd");
  if (tables != "bhsd" && tables != "bshd")
    return InvalidArgument(where, ": rope_tables must be bhsd or bshd, got ", tables);
  d.rope_tables_bshd = tables == "bshd";
  if ((d.rope_q || d.rope_k) && (d.rope_dim % 2 != 0 || d.rope_dim <= 0 || d.rope_dim > d.d))
    return InvalidArgument(where, ": RoPE rotates an even number of values, at most head_dim ", d.d, "; got ",
                           d.rope_dim);
  d.out_shape = AttrInts(a, "output_shape", {});
  d.proj = AttrInt(a, "qkv_proj", 0) != 0;
  if (!d.proj && a.count(kRmsEpsilon))
    return InvalidArgument(where, ": rms_epsilon needs the projected form (qkv_proj)");
  d.proj_bias = AttrInt(a, "qkv_bias", 0) != 0;
  if (d.proj_bias && !d.proj) return InvalidArgument(where, ": qkv_bias needs the projected form (qkv_proj)");
  if (d.proj) {
    const std::vector<int64_t> split = AttrInts(a, "qkv_split", {0, 1, 2});
    if (split.size() != 3 || std::set<int64_t>(split.begin(), split.end()) != std::set<int64_t>{0, 1, 2})
      return InvalidArgument(where, ": qkv_split must order 0, 1, 2 (which third of W is q, k, v)");
    for (int i = 0; i < 3; ++i) d.proj_split[i] = split[static_cast<size_t>(i)];
    if (a.count(kRmsEpsilon)) {
      d.rms_eps = AttrFloat(a, kRmsEpsilon, 0.f);
      if (!(d.rms_eps >= 0)) return InvalidArgument(where, ": rms_epsilon must be >= 0");
    }
    if (d.q != Layout::kBSHD || d.k != Layout::kBSHD || d.v != Layout::kBSHD || d.s != d.sk || d.d != d.dv)
      return InvalidArgument(where, ": the projected form needs bshd q, k, v, seq_q = seq_k and head_dim = v_head_dim");
  }
  return d;
}

std::optional<float> AttentionRmsEpsilon(const AttributeMap& a) {
  if (!a.count(kRmsEpsilon)) return std::nullopt;
  return AttrFloat(a, kRmsEpsilon, 0.f);
}

void SetAttentionRmsEpsilon(AttributeMap& a, float epsilon) { a[kRmsEpsilon] = epsilon; }

HeadAccess Access(Layout l, const Dims&, int64_t heads, int64_t rows, int64_t cols) {
  switch (l) {
    case Layout::kBSHD: return {rows * heads * cols, cols, heads * cols};
    case Layout::kBHSD: return {heads * rows * cols, rows * cols, cols};
    case Layout::kBHDS: return {heads * rows * cols, rows * cols, rows};  // rows of K^T: Sk apart
  }
  return {0, 0, 0};
}

Status CheckAttentionOperands(const Dims& d, std::span<const DType> dtypes, std::span<const Shape> shapes,
                              const std::string& where, AttentionDTypes accept) {
  if (static_cast<int>(shapes.size()) != d.num_inputs())
    return InvalidArgument(where, ": expects ", d.num_inputs(),
                           d.proj ? (d.proj_bias ? " inputs (x, W, qkv bias" : " inputs (x, W") : " inputs (q, k, v",
                           d.mask ? ", mask" : "", d.mask_select != 0 ? ", bool mask" : "",
                           d.rope_q || d.rope_k ? ", cos, sin" : "", "), got ", shapes.size());
  const size_t bool_at = d.mask_select != 0 ? static_cast<size_t>(d.bool_mask_index()) : SIZE_MAX;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (i == bool_at) {
      if (dtypes[i] != DType::kBool)
        return InvalidArgument(where, ": a selecting mask (mask_select ", d.mask_select, ") is bool, not ",
                               DTypeName(dtypes[i]));
      continue;
    }
    if (accept == AttentionDTypes::kF32 && dtypes[i] != DType::kF32)
      return Unimplemented(where, ": this attention kernel runs in f32 only; input ", i, " is ", DTypeName(dtypes[i]));
    if (!IsFloat(dtypes[i]) || dtypes[i] != dtypes[0])
      return InvalidArgument(where, ": attention operands share one float dtype; input 0 is ", DTypeName(dtypes[0]),
                             ", input ", i, " is ", DTypeName(dtypes[i]));
  }
  auto check = [&](size_t i, const char* name, Layout l, int64_t heads, int64_t rows, int64_t cols) -> Status {
    const Shape& s = shapes[i];
    int64_t n = 1;
    for (int64_t x : s) n *= x;
    const Shape want = l == Layout::kBHDS ? Shape{d.b, heads, cols, rows} : Shape{d.b, heads, rows, cols};
    // A head-split operand may also merge B and H: [B*H, rows, cols] (torch's bmm form).
    const Shape merged{d.b * heads, want[2], want[3]};
    if (l == Layout::kBSHD ? n != d.b * rows * heads * cols : s != want && s != merged)
      return InvalidArgument(where, ": ", name, " ", ShapeToString(s), " does not hold ",
                             l == Layout::kBSHD ? StrCat("[B,S,H*d] = [", d.b, ",", rows, ",", heads * cols, "]")
                                                : ShapeToString(want));
    return Status::Ok();
  };
  if (d.proj) {
    const Shape& x = shapes[0];
    const Shape& w = shapes[1];
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < x.size(); ++i) rows *= x[i];
    if (x.size() < 2 || rows != d.b * d.s || w.size() != 2 || w[0] != x.back() || w[1] != d.proj_cols())
      return InvalidArgument(where, ": projected attention needs x [..., K] with B*S = ", d.b * d.s,
                             " rows and W [K, (H + 2*KV)*d = ", d.proj_cols(), "], got x ", ShapeToString(x), " and W ",
                             ShapeToString(w));
    if (d.proj_bias && shapes[2] != Shape{d.proj_cols()})
      return InvalidArgument(where, ": the qkv bias is ", ShapeToString(shapes[2]), ", not [(H + 2*KV)*d = ",
                             d.proj_cols(), "]");
  } else {
    GF_RETURN_IF_ERROR(check(0, "q", d.q, d.h, d.s, d.d));
    GF_RETURN_IF_ERROR(check(1, "k", d.k, d.kv_h, d.sk, d.d));
    GF_RETURN_IF_ERROR(check(2, "v", d.v, d.kv_h, d.sk, d.dv));
  }
  size_t next = static_cast<size_t>(d.first_extra());
  auto broadcasts = [&](const Shape& s, const Shape& to, const char* name) -> Status {
    const Shape both[2] = {s, to};
    auto r = BroadcastShapes(both);
    if (s.size() > to.size() || !r.ok() || *r != to)
      return InvalidArgument(where, ": ", name, " ", ShapeToString(s), " does not broadcast to ", ShapeToString(to));
    return Status::Ok();
  };
  if (d.mask) GF_RETURN_IF_ERROR(broadcasts(shapes[next++], Shape{d.b, d.h, d.s, d.sk}, "mask"));
  if (d.mask_select != 0) GF_RETURN_IF_ERROR(broadcasts(shapes[next++], Shape{d.b, d.h, d.s, d.sk}, "bool mask"));
  if (d.rope_q || d.rope_k)
    for (const char* name : {"cos", "sin"}) {
      const Shape& s = shapes[next++];
      if (s.empty() || s.back() != d.rope_dim)
        return InvalidArgument(where, ": ", name, " ", ShapeToString(s), " must end in the rotated width ", d.rope_dim);
      if (d.rope_q)
        GF_RETURN_IF_ERROR(broadcasts(s, d.rope_tables_bshd ? Shape{d.b, d.s, d.h, d.rope_dim} : Shape{d.b, d.h, d.s, d.rope_dim},
                                      name));
      if (d.rope_k)
        GF_RETURN_IF_ERROR(broadcasts(
            s, d.rope_tables_bshd ? Shape{d.b, d.sk, d.kv_h, d.rope_dim} : Shape{d.b, d.kv_h, d.sk, d.rope_dim}, name));
    }
  int64_t n = 1;
  for (int64_t x : d.out_shape) n *= x;
  if (d.out_shape.empty() || n != d.b * d.h * d.s * d.dv ||
      (d.out == Layout::kBHSD && d.out_shape != Shape{d.b, d.h, d.s, d.dv} &&
       d.out_shape != Shape{d.b * d.h, d.s, d.dv}))
    return InvalidArgument(where, ": output_shape ", ShapeToString(d.out_shape), " does not hold ",
                           d.out == Layout::kBHSD ? "[B,H,S,dv]" : "[B,S,H*dv]", " = ",
                           ShapeToString(Shape{d.b, d.h, d.s, d.dv}), " in ", d.out == Layout::kBHSD ? "bhsd" : "bshd",
                           " order");
  return Status::Ok();
}

namespace {

Result<std::vector<ValueType>> InferAttention(const InferContext& ctx) {
  GF_ASSIGN_OR_RETURN(Dims d, ReadDims(ctx.attrs, ctx.Describe()));
  std::vector<DType> dtypes;
  std::vector<Shape> shapes;
  for (const Value* v : ctx.inputs) {
    if (!v) return InvalidArgument(ctx.Describe(), ": FusedAttention takes no omitted inputs (flags say which are present)");
    dtypes.push_back(v->dtype());
    shapes.push_back(v->shape());
  }
  GF_RETURN_IF_ERROR(CheckAttentionOperands(d, dtypes, shapes, ctx.Describe(), AttentionDTypes::kAnyFloat));
  return std::vector<ValueType>{{dtypes[0], d.out_shape}};
}

}  // namespace

std::vector<OpSchema> AttentionSchemas() {
  return {
      {"FusedAttention", 2, 7, 1, InferAttention},  // projected, no mask nor RoPE: x, W
  };
}

}  // namespace graphfuse::schemas
