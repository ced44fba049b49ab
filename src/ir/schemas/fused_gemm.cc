// FusedGemm: S projections of one input through concatenated weights, with an elementwise
// epilogue, formed by src/passes/fuse_gemm.cc: its geometry and inference. The attributes are
// documented with the CPU kernel (src/cpu/kernels/fused_gemm.cc).
#include "ir/schemas/fused_gemm.h"

#include <climits>
#include <vector>

#include "ir/schemas/infer_util.h"
#include "ir/schemas/schema_lists.h"

namespace graphfuse::schemas {

namespace {

// The attribute keys (FusedGemmAttrs documents each).
constexpr char kSplits[] = "splits";
constexpr char kOutProj[] = "out_proj";
constexpr char kEpilogue[] = "epilogue";
constexpr char kRowScale[] = "row_scale";
constexpr char kRmsEpsilon[] = "rms_epsilon";

}  // namespace

FusedGemmAttrs FusedGemmAttrs::Read(const AttributeMap& attrs) {
  FusedGemmAttrs a;
  a.splits = AttrInt(attrs, kSplits, 1);
  a.out_proj = AttrInts(attrs, kOutProj, {});
  if (auto it = attrs.find(kEpilogue); it != attrs.end())
    if (const auto* g = std::get_if<std::shared_ptr<const Graph>>(&it->second)) a.epilogue = *g;
  a.row_scale = AttrInt(attrs, kRowScale, -1);
  if (attrs.count(kRmsEpsilon)) a.rms_epsilon = AttrFloat(attrs, kRmsEpsilon, 1e-6f);
  return a;
}

void FusedGemmAttrs::WriteTo(AttributeMap& attrs) const {
  attrs[kSplits] = splits;
  attrs[kOutProj] = out_proj;
  if (epilogue) attrs[kEpilogue] = epilogue;
  else attrs.erase(kEpilogue);
  if (row_scale >= 0) attrs[kRowScale] = row_scale;
  else attrs.erase(kRowScale);
  if (rms_epsilon) attrs[kRmsEpsilon] = *rms_epsilon;
  else attrs.erase(kRmsEpsilon);
}

Result<GemmGeometry> Geometry(const std::string& where, const Shape& a, const Shape& w, int64_t splits) {
  if (a.size() < 2 || w.size() != 2)
    return InvalidArgument(where, ": FusedGemm needs A of rank >= 2 and 2-D weights, got ", ShapeToString(a), " and ",
                           ShapeToString(w));
  if (splits < 1 || w[1] % splits != 0)
    return InvalidArgument(where, ": weights ", ShapeToString(w), " do not split into ", splits, " equal projections");
  GemmGeometry g;
  g.k = a.back();
  if (w[0] != g.k)
    return InvalidArgument(where, ": inner dimensions differ: A ", ShapeToString(a), " has K=", g.k, ", weights ",
                           ShapeToString(w), " have K=", w[0]);
  g.splits = splits;
  g.n = w[1] / splits;
  g.m = Product(a, 0, a.size() - 1);
  g.out_shape = Shape(a.begin(), a.end() - 1);
  g.out_shape.push_back(g.n);
  for (int64_t v : {g.m, g.k, w[1]})
    if (v > INT_MAX) return Unimplemented(where, ": a GEMM dimension of ", v, " exceeds the BLAS int range");
  return g;
}

namespace {

Result<std::vector<ValueType>> InferFusedGemm(const InferContext& ctx) {
  const Value* a = ctx.input(0);
  const Value* w = ctx.input(1);
  // A and W of one float dtype; the projections come out in it (sums in f32, rounded once).
  if (!IsFloat(a->dtype()) || w->dtype() != a->dtype())
    return InvalidArgument(ctx.Describe(), ": FusedGemm takes A and W of one float dtype, got ", a->TypeString(),
                           " and ", w->TypeString());
  const DType pt = a->dtype();
  const FusedGemmAttrs attrs = FusedGemmAttrs::Read(ctx.attrs);
  GF_ASSIGN_OR_RETURN(GemmGeometry g, Geometry(ctx.Describe(), a->shape(), w->shape(), attrs.splits));
  const std::vector<int64_t>& out_proj = attrs.out_proj;
  if (out_proj.empty()) return InvalidArgument(ctx.Describe(), ": needs an 'out_proj' attribute (one entry per output)");
  const Graph* epi = attrs.epilogue.get();
  const int64_t row_scale = attrs.row_scale;
  Shape row_shape(g.out_shape.begin(), g.out_shape.end() - 1);  // [..., 1]: one value per row
  row_shape.push_back(1);
  if (row_scale >= 0) {
    if (row_scale != static_cast<int64_t>(ctx.inputs.size()) - 1 || row_scale < 2)
      return InvalidArgument(ctx.Describe(), ": row_scale must name the last input, after A and W");
    const Value* rs = ctx.inputs[static_cast<size_t>(row_scale)];
    if (rs->dtype() != DType::kF32 || rs->shape() != row_shape)
      return InvalidArgument(ctx.Describe(), ": row_scale input must be ", TypeStr(DType::kF32, row_shape), ", got ",
                             TypeStr(rs->dtype(), rs->shape()));
  }
  const size_t extras = ctx.inputs.size() - 2 - (row_scale >= 0 ? 1 : 0);
  if (epi) {
    if (epi->inputs().size() != static_cast<size_t>(g.splits) + extras)
      return InvalidArgument(ctx.Describe(), ": the epilogue takes ", epi->inputs().size(), " inputs, the node gives ",
                             g.splits, " projections + ", extras, " extra inputs");
    for (size_t i = 0; i < epi->inputs().size(); ++i) {
      const Value* b = epi->inputs()[i];
      const bool proj = i < static_cast<size_t>(g.splits);
      const DType dt = proj ? pt : ctx.inputs[2 + i - g.splits]->dtype();
      const Shape& sh = proj ? g.out_shape : ctx.inputs[2 + i - g.splits]->shape();
      if (b->dtype() != dt || b->shape() != sh)
        return InvalidArgument(ctx.Describe(), ": epilogue input ", i, " must be ", TypeStr(dt, sh));
    }
  } else if (extras != 0) {
    return InvalidArgument(ctx.Describe(), ": extra inputs without an epilogue");
  }
  std::vector<ValueType> out;
  size_t next_epi = 0;
  for (int64_t s : out_proj) {
    if (s >= 0) {
      if (s >= g.splits) return InvalidArgument(ctx.Describe(), ": out_proj names projection ", s, " of ", g.splits);
      out.push_back({pt, g.out_shape});
    } else {
      if (!epi || next_epi >= epi->outputs().size())
        return InvalidArgument(ctx.Describe(), ": more epilogue outputs in out_proj than the epilogue has");
      const Value* o = epi->outputs()[next_epi++];
      out.push_back({o->dtype(), o->shape()});
    }
  }
  if (epi && next_epi != epi->outputs().size())
    return InvalidArgument(ctx.Describe(), ": the epilogue has ", epi->outputs().size(), " outputs, out_proj uses ",
                           next_epi);
  if (attrs.rms_epsilon) {
    if (out[0].dtype != DType::kF32 || out[0].shape != g.out_shape)
      return InvalidArgument(ctx.Describe(), ": rms_epsilon needs output 0 to be ", TypeStr(DType::kF32, g.out_shape));
    out.push_back({DType::kF32, row_shape});
  }
  return out;
}

}  // namespace

std::vector<OpSchema> FusedGemmSchemas() { return {{"FusedGemm", 2, INT_MAX, -1, InferFusedGemm}}; }

}  // namespace graphfuse::schemas
