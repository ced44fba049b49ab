// Row normalizations over the trailing dims X.shape[axis:]:
//   LayerNormalization (ONNX opset 17): Y = (X - mean) / sqrt(var + epsilon) * Scale + B,
//     optional outputs Mean and InvStdDev (f32, X.shape[:axis] + ones);
//   RMSNorm (graphfuse):               Y = X / sqrt(mean(X^2) + epsilon) * scale.
// Statistics accumulate in double (two-pass variance), so a row of 1e6 similar values keeps its
// variance; the per-element normalization runs in f32. f16/bf16 rows are converted to f32.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernel_util.h"
#include "norm_rows.h"

namespace graphfuse::kernels {
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

// A parameter broadcast to one full row of D values (null when the input is omitted).
std::vector<float> ExpandRow(const KernelContext& ctx, size_t i, const Shape& norm, float fill) {
  if (!HasInput(ctx, i)) return std::vector<float>(static_cast<size_t>(Product(norm)), fill);
  return ParamRow(ctx.inputs[i], norm);
}

// Runs row_fn(x_row, y_row, row) over every row with f32 pointers: f32 tensors are used in
// place, f16/bf16 rows go through per-thread scratch.
template <class RowFn>
void ForEachRow(const KernelContext& ctx, int64_t rows, int64_t d, RowFn&& row_fn) {
  const TensorView& X = ctx.inputs[0];
  const TensorView& Y = ctx.outputs[0];
  ParallelFor(ctx.cpu, rows, d * 4, [&](int64_t begin, int64_t end) {
    if (X.dtype == DType::kF32) {
      for (int64_t r = begin; r < end; ++r) row_fn(X.as<const float>() + r * d, Y.as<float>() + r * d, r);
      return;
    }
    std::vector<float> xs(static_cast<size_t>(d)), ys(static_cast<size_t>(d));
    for (int64_t r = begin; r < end; ++r) {
      LoadF32(X.dtype, X.data, r * d, 1, d, xs.data());
      row_fn(xs.data(), ys.data(), r);
      StoreF32(Y.dtype, Y.data, r * d, 1, d, ys.data());
    }
  });
}

// ---- LayerNormalization ----

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

Status LayerNormKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  const int64_t rank = static_cast<int64_t>(X.shape.size());
  GF_ASSIGN_OR_RETURN(const int64_t axis, KernelAxis(ctx, "axis", -1, rank));
  const double eps = ctx.node.GetFloat("epsilon", 1e-5f);
  const Shape norm(X.shape.begin() + axis, X.shape.end());
  const int64_t d = Product(norm), rows = Product(X.shape, 0, static_cast<size_t>(axis));
  const std::vector<float> scale = ExpandRow(ctx, 1, norm, 1.f);
  const std::vector<float> bias = ExpandRow(ctx, 2, norm, 0.f);
  const bool has_bias = HasInput(ctx, 2);
  float* mean_out = ctx.outputs.size() > 1 ? ctx.outputs[1].as<float>() : nullptr;
  float* inv_out = ctx.outputs.size() > 2 ? ctx.outputs[2].as<float>() : nullptr;
  ForEachRow(ctx, rows, d, [&](const float* x, float* y, int64_t r) {
    LayerNormRow(x, y, d, scale.data(), has_bias ? bias.data() : nullptr, eps, mean_out ? mean_out + r : nullptr,
                 inv_out ? inv_out + r : nullptr);
  });
  return Status::Ok();
}

// ---- RMSNorm ----

Result<std::vector<ValueType>> InferRmsNorm(const InferContext& ctx) {
  GF_RETURN_IF_ERROR(InferNormShape(ctx, -1).status());
  return std::vector<ValueType>{{ctx.input(0)->dtype(), ctx.input(0)->shape()}};
}

Status RmsNormKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  const int64_t rank = static_cast<int64_t>(X.shape.size());
  GF_ASSIGN_OR_RETURN(const int64_t axis, KernelAxis(ctx, "axis", -1, rank));
  const double eps = ctx.node.GetFloat("epsilon", 1e-6f);
  const Shape norm(X.shape.begin() + axis, X.shape.end());
  const int64_t d = Product(norm), rows = Product(X.shape, 0, static_cast<size_t>(axis));
  const std::vector<float> scale = ExpandRow(ctx, 1, norm, 1.f);
  const bool has_scale = HasInput(ctx, 1);
  ForEachRow(ctx, rows, d, [&](const float* x, float* y, int64_t) {
    RmsNormRow(x, y, d, has_scale ? scale.data() : nullptr, eps);
  });
  return Status::Ok();
}

}  // namespace

std::vector<OpSchema> NormSchemas() {
  return {
      // Y, Mean, InvStdDev: a node may ask for the first 1, 2 or 3.
      {"LayerNormalization", 2, 3, -1, InferLayerNorm, LayerNormKernel},
      {"RMSNorm", 1, 2, 1, InferRmsNorm, RmsNormKernel},
  };
}

}  // namespace graphfuse::kernels
