// Softmax and LogSoftmax over one axis (ONNX opset 13: axis default -1, the single axis, not
// the flattened tail of opset 11): inference. The CPU kernels are in src/cpu/kernels/softmax.cc.
#include "ir/schemas/infer_util.h"
#include "ir/schemas/schema_lists.h"

namespace graphfuse::schemas {
namespace {

Result<std::vector<ValueType>> InferSoftmax(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  if (!IsFloat(x->dtype()))
    return InvalidArgument(ctx.Describe(), ": ", ctx.op, " needs a float input, got ", DTypeName(x->dtype()));
  const int64_t rank = static_cast<int64_t>(x->shape().size());
  if (rank == 0) return InvalidArgument(ctx.Describe(), ": ", ctx.op, " needs an input of rank >= 1");
  GF_RETURN_IF_ERROR(NormalizeAxis(ctx, ctx.GetInt("axis", -1), rank).status());
  return std::vector<ValueType>{{x->dtype(), x->shape()}};
}

}  // namespace

std::vector<OpSchema> SoftmaxSchemas() {
  return {
      {"Softmax", 1, 1, 1, InferSoftmax},
      {"LogSoftmax", 1, 1, 1, InferSoftmax},
  };
}

}  // namespace graphfuse::schemas
