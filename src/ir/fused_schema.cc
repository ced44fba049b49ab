// FusedElementwise: a group of op-table nodes run as one kernel. Its "body" attribute is a
// graph whose inputs and outputs correspond one to one to the node's; the planner
// (src/passes/fuse_elementwise.cc) creates these nodes, a backend lowers each body once.
#include "ir/elementwise_body.h"
#include "ir/op_registry.h"

namespace graphfuse {
namespace {

Result<std::vector<ValueType>> InferFused(const InferContext& ctx) {
  auto it = ctx.attrs.find("body");
  const auto* body_ptr = it == ctx.attrs.end() ? nullptr : std::get_if<std::shared_ptr<const Graph>>(&it->second);
  if (!body_ptr || !*body_ptr) return InvalidArgument(ctx.Describe(), ": needs a 'body' graph attribute");
  const Graph& body = **body_ptr;
  if (body.inputs().size() != ctx.inputs.size())
    return InvalidArgument(ctx.Describe(), ": the body takes ", body.inputs().size(), " inputs");
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    const Value* in = ctx.inputs[i];
    const Value* b = body.inputs()[i];
    if (!in || in->dtype() != b->dtype() || in->shape() != b->shape())
      return InvalidArgument(ctx.Describe(), ": input ", i, " must be ", b->TypeString());
  }
  std::vector<ValueType> out;
  for (const Value* o : body.outputs()) out.push_back({o->dtype(), o->shape()});
  return out;
}

}  // namespace

std::vector<OpSchema> FusedSchemas() {
  OpSchema s{"FusedElementwise", 0, static_cast<int>(kMaxBodyInputs), -1, &InferFused};
  return {s};
}

}  // namespace graphfuse
