// The CPU kernels of the shape ops that produce data (also run by constant folding): Shape, Size,
// ConstantOfShape, Constant, Range. The views (Reshape, Flatten, Squeeze, Unsqueeze, Identity)
// have no kernel: the executor aliases output 0 to input 0's buffer. Semantics and inference:
// src/ir/schemas/shape_ops.cc.
#include <cstring>
#include <memory>
#include <vector>

#include "ir/schemas/shape_ops.h"
#include "cpu/kernels/kernel_lists.h"
#include "cpu/kernels/kernel_util.h"

namespace graphfuse::kernels {
namespace {

using schemas::ConstantValue;
using schemas::FillValue;
using schemas::RangeArgs;
using schemas::ReadRangeArgs;
using schemas::ShapeRange;

// ---- Shape ----

// Reads only the input's shape: its data may be absent (constant folding of static shapes).
Status ShapeKernel(const KernelContext& ctx) {
  const Shape& in = ctx.inputs[0].shape;
  const int64_t rank = static_cast<int64_t>(in.size());
  auto [b, e] = ShapeRange(rank, ctx.node.GetInt("start", 0), ctx.node.GetInt("end", rank));
  int64_t* out = ctx.outputs[0].as<int64_t>();
  for (int64_t i = b; i < e; ++i) out[i - b] = in[i];
  return Status::Ok();
}

// Reads only the input's shape, as Shape does.
Status SizeKernel(const KernelContext& ctx) {
  *ctx.outputs[0].as<int64_t>() = ctx.inputs[0].numel();
  return Status::Ok();
}

// ---- ConstantOfShape ----

Status ConstantOfShapeKernel(const KernelContext& ctx) {
  GF_ASSIGN_OR_RETURN(const Tensor* v, FillValue(ctx.node.attrs(), KernelWhere(ctx)));
  const TensorView& Y = ctx.outputs[0];
  const size_t esize = DTypeSize(Y.dtype);
  const float zero = 0.f;
  const void* value = v ? v->data() : &zero;
  char* out = static_cast<char*>(Y.data);
  for (int64_t i = 0, n = Y.numel(); i < n; ++i) std::memcpy(out + i * esize, value, esize);
  return Status::Ok();
}

// ---- Constant ----

Status ConstantKernel(const KernelContext& ctx) {
  GF_ASSIGN_OR_RETURN(auto t, ConstantValue(ctx.node.attrs(), KernelWhere(ctx)));
  if (t->nbytes()) std::memcpy(ctx.outputs[0].data, t->data(), t->nbytes());
  return Status::Ok();
}

// ---- Range ----

Status RangeKernel(const KernelContext& ctx) {
  const TensorView views[3] = {ctx.inputs[0], ctx.inputs[1], ctx.inputs[2]};
  GF_ASSIGN_OR_RETURN(RangeArgs a, ReadRangeArgs(views, KernelWhere(ctx)));
  const TensorView& Y = ctx.outputs[0];
  const int64_t n = Y.numel();
  if (Y.dtype == DType::kI64) {
    for (int64_t i = 0; i < n; ++i) Y.as<int64_t>()[i] = a.i[0] + i * a.i[2];
  } else if (Y.dtype == DType::kI32) {
    for (int64_t i = 0; i < n; ++i) Y.as<int32_t>()[i] = static_cast<int32_t>(a.i[0] + i * a.i[2]);
  } else {
    for (int64_t i = 0; i < n; ++i) StoreFromDouble(Y, i, a.f[0] + static_cast<double>(i) * a.f[2]);
  }
  return Status::Ok();
}

}  // namespace

std::vector<CpuKernel> ShapeOpKernels() {
  return {
      {"Shape", ShapeKernel},
      {"Size", SizeKernel},
      {"ConstantOfShape", ConstantOfShapeKernel},
      {"Constant", ConstantKernel},
      {"Range", RangeKernel},
  };
}

}  // namespace graphfuse::kernels
