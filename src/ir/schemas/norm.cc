// Row normalizations over the trailing dims X.shape[axis:] (inference; the CPU kernels are in
// src/cpu/kernels/norm.cc):
//   LayerNormalization (ONNX opset 17): Y = (X - mean) / sqrt(var + epsilon) * Scale + B,
//     optional outputs Mean and InvStdDev (f32, X.shape[:axis] + ones);
//   RMSNorm (graphfuse):               Y = X / sqrt(mean(X^2) + epsilon) * scale;
//   FusedLayerNorms (graphfuse):       K LayerNormalizations of one X (the FuseSiblingNorms
//     pass): inputs X, then Scale_k (and B_k when with_bias = 1) for k < norms; outputs Y_k.
#include "ir/schemas/infer_util.h"
#include "ir/schemas/schema_lists.h"

namespace graphfuse::schemas {
namespace {

// Checks that `p` (Scale / B) broadcasts unidirectionally to the normalized shape.
Status CheckParamShape(const InferContext& ctx, size_t i, const char* what, const Shape& norm) {
  const Value* p = ctx.input(i);
  if (p == nullptr) return Status::Ok();
  if (p->dtype() != ctx.input(0)->dtype())
    return InvalidArgument(ctx.Describe(), ": ", what, " must have X's dtype ", DTypeName(ctx.input(0)->dtype()),
                           ", got ", DTypeName(p->dtype()));
  const Shape& s = p->shape();
  bool ok = s.size() <= norm.size();
  for (size_t k = 0; ok && k < s.size(); ++k) {
    const int64_t d = s[s.size() - 1 - k];
    ok = d == 1 || d == norm[norm.size() - 1 - k];
  }
  if (!ok)
    return InvalidArgument(ctx.Describe(), ": ", what, " ", ShapeToString(s),
                           " does not broadcast to the normalized shape ", ShapeToString(norm));
  return Status::Ok();
}

struct NormShape {
  int64_t axis;
  Shape norm;  // X.shape[axis:]
};

Result<NormShape> InferNormShape(const InferContext& ctx, int64_t default_axis) {
  const Value* x = ctx.input(0);
  if (!IsFloat(x->dtype()))
    return InvalidArgument(ctx.Describe(), ": ", ctx.op, " needs a float input, got ", DTypeName(x->dtype()));
  const int64_t rank = static_cast<int64_t>(x->shape().size());
  if (rank == 0) return InvalidArgument(ctx.Describe(), ": ", ctx.op, " needs an input of rank >= 1");
  GF_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(ctx, ctx.GetInt("axis", default_axis), rank));
  NormShape ns{axis, Shape(x->shape().begin() + axis, x->shape().end())};
  GF_RETURN_IF_ERROR(CheckParamShape(ctx, 1, "scale", ns.norm));
  GF_RETURN_IF_ERROR(CheckParamShape(ctx, 2, "bias", ns.norm));
  return ns;
}

Result<std::vector<ValueType>> InferLayerNorm(const InferContext& ctx) {
  GF_ASSIGN_OR_RETURN(NormShape ns, InferNormShape(ctx, -1));
  if (ctx.GetInt("stash_type", 1) != 1)
    return Unimplemented(ctx.Describe(), ": stash_type ", ctx.GetInt("stash_type", 1),
                         " is not supported (only 1: f32 statistics)");
  if (ctx.input(1) == nullptr) return InvalidArgument(ctx.Describe(), ": LayerNormalization needs a Scale input");
  const Value* x = ctx.input(0);
  Shape stat = x->shape();
  for (size_t k = static_cast<size_t>(ns.axis); k < stat.size(); ++k) stat[k] = 1;
  // Y, then the optional Mean and InvStdDev (a node asking for one output keeps only Y).
  return std::vector<ValueType>{{x->dtype(), x->shape()}, {DType::kF32, stat}, {DType::kF32, stat}};
}

Result<std::vector<ValueType>> InferRmsNorm(const InferContext& ctx) {
  GF_RETURN_IF_ERROR(InferNormShape(ctx, -1).status());
  return std::vector<ValueType>{{ctx.input(0)->dtype(), ctx.input(0)->shape()}};
}

Result<std::vector<ValueType>> InferFusedLayerNorms(const InferContext& ctx) {
  const int64_t norms = ctx.GetInt("norms", 0), with_bias = ctx.GetInt("with_bias", 0);
  const int64_t per = with_bias ? 2 : 1;
  if (norms < 2 || (with_bias != 0 && with_bias != 1) || ctx.inputs.size() != static_cast<size_t>(1 + norms * per))
    return InvalidArgument(ctx.Describe(), ": FusedLayerNorms takes X and ", with_bias ? "a scale and a bias" : "a scale",
                           " for each of its norms (attribute norms >= 2, with_bias 0 or 1); got norms = ", norms,
                           ", with_bias = ", with_bias, " and ", ctx.inputs.size(), " inputs");
  GF_ASSIGN_OR_RETURN(NormShape ns, InferNormShape(ctx, -1));
  for (int64_t k = 1; k < norms; ++k) {
    GF_RETURN_IF_ERROR(CheckParamShape(ctx, static_cast<size_t>(1 + k * per), "scale", ns.norm));
    if (with_bias) GF_RETURN_IF_ERROR(CheckParamShape(ctx, static_cast<size_t>(2 + k * per), "bias", ns.norm));
  }
  for (int64_t k = 0; k < norms; ++k)
    if (ctx.input(static_cast<size_t>(1 + k * per)) == nullptr ||
        (with_bias && ctx.input(static_cast<size_t>(2 + k * per)) == nullptr))
      return InvalidArgument(ctx.Describe(), ": norm ", k, " of FusedLayerNorms lacks its scale or bias");
  const Value* x = ctx.input(0);
  return std::vector<ValueType>(static_cast<size_t>(norms), ValueType{x->dtype(), x->shape()});
}

}  // namespace

std::vector<OpSchema> NormSchemas() {
  return {
      // Y, Mean, InvStdDev: a node may ask for the first 1, 2 or 3.
      {"LayerNormalization", 2, 3, -1, InferLayerNorm},
      {"RMSNorm", 1, 2, 1, InferRmsNorm},
      {"FusedLayerNorms", 3, 255, -1, InferFusedLayerNorms},
  };
}

}  // namespace graphfuse::schemas
