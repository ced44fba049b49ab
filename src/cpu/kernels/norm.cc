// Row normalizations over the trailing dims X.shape[axis:]:
//   LayerNormalization (ONNX opset 17): Y = (X - mean) / sqrt(var + epsilon) * Scale + B,
//     optional outputs Mean and InvStdDev (f32, X.shape[:axis] + ones);
//   RMSNorm (graphfuse):               Y = X / sqrt(mean(X^2) + epsilon) * scale;
//   FusedLayerNorms (graphfuse):       K LayerNormalizations of one X: each row's statistics
//     once, then Y_k = (X - mean) * inv * Scale_k + B_k for every k, with the bits of K
//     separate LayerNorms (norm_rows.h), reading X once.
// Statistics accumulate in double (two-pass variance), so a row of 1e6 similar values keeps its
// variance; the per-element normalization runs in f32. f16/bf16 rows are converted to f32.
// The CPU kernels; the ops' shape rules and inference are in src/ir/schemas/norm.cc.
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/kernels/kernel_lists.h"
#include "cpu/kernels/kernel_util.h"
#include "cpu/kernels/norm_rows.h"

namespace graphfuse::kernels {
namespace {

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

// ---- FusedLayerNorms ----

Status FusedLayerNormsKernel(const KernelContext& ctx) {
  const TensorView& X = ctx.inputs[0];
  const int64_t rank = static_cast<int64_t>(X.shape.size());
  GF_ASSIGN_OR_RETURN(const int64_t axis, KernelAxis(ctx, "axis", -1, rank));
  const double eps = ctx.node.GetFloat("epsilon", 1e-5f);
  const size_t norms = ctx.outputs.size();
  const bool with_bias = ctx.node.GetInt("with_bias", 0) != 0;
  const size_t per = with_bias ? 2 : 1;
  const Shape norm(X.shape.begin() + axis, X.shape.end());
  const int64_t d = Product(norm), rows = Product(X.shape, 0, static_cast<size_t>(axis));
  std::vector<std::vector<float>> scale(norms), bias(norms);
  for (size_t k = 0; k < norms; ++k) {
    scale[k] = ExpandRow(ctx, 1 + k * per, norm, 1.f);
    if (with_bias) bias[k] = ExpandRow(ctx, 2 + k * per, norm, 0.f);
  }
  const bool f32 = X.dtype == DType::kF32;
  ParallelFor(ctx.cpu, rows, d * 4 * static_cast<int64_t>(1 + norms), [&](int64_t begin, int64_t end) {
    std::vector<float> xs(f32 ? 0 : static_cast<size_t>(d)), ys(f32 ? 0 : static_cast<size_t>(d));
    for (int64_t r = begin; r < end; ++r) {
      if (!f32) LoadF32(X.dtype, X.data, r * d, 1, d, xs.data());
      const float* x = f32 ? X.as<const float>() + r * d : xs.data();
      const LayerNormStats st = LayerNormRowStats(x, d, eps);
      for (size_t k = 0; k < norms; ++k) {
        const TensorView& Y = ctx.outputs[k];
        float* y = f32 ? Y.as<float>() + r * d : ys.data();
        LayerNormRowApply(x, y, d, scale[k].data(), with_bias ? bias[k].data() : nullptr, st);
        if (!f32) StoreF32(Y.dtype, Y.data, r * d, 1, d, ys.data());
      }
    }
  });
  return Status::Ok();
}

// ---- RMSNorm ----

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

std::vector<CpuKernel> NormKernels() {
  return {
      {"LayerNormalization", LayerNormKernel},
      {"RMSNorm", RmsNormKernel},
      {"FusedLayerNorms", FusedLayerNormsKernel},
  };
}

}  // namespace graphfuse::kernels
