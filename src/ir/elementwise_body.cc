#include "ir/elementwise_body.h"

#include <vector>

#include "ops/reference.h"

namespace graphfuse {

bool ComputesInIntegers(const Node& n) {
  std::vector<DType> dtypes;
  for (const Value* in : n.inputs()) dtypes.push_back(in->dtype());
  return ComputesInIntegers(*OpFromName(n.op()), dtypes);
}

Status CheckElementwiseBody(const Graph& body) {
  const std::string& name = body.name();
  if (body.outputs().empty()) return InvalidArgument("fused group '", name, "' has no outputs");
  const Shape& space = body.outputs()[0]->shape();
  if (space.size() > kMaxBodyRank) return Unimplemented("fused group '", name, "': rank ", space.size());
  if (body.nodes().empty()) return InvalidArgument("fused group '", name, "' has no nodes");
  if (body.inputs().size() > kMaxBodyInputs)
    return Unimplemented("fused group '", name, "' reads ", body.inputs().size(), " inputs (at most ", kMaxBodyInputs,
                         ")");
  for (const Value* in : body.inputs())
    if (in->shape().size() > space.size())
      return InvalidArgument("fused group '", name, "': input '", in->name(), "' has a larger rank than the group");
  if (!body.constants().empty())
    return InvalidArgument("fused group '", name, "' holds constants; they must be inputs");

  const Node& first = *body.nodes().front();
  const bool integer_domain = OpFromName(first.op()).ok() && ComputesInIntegers(first);
  size_t instrs = 0;
  for (const auto& n : body.nodes()) {
    auto kind = OpFromName(n->op());
    if (!kind.ok()) return InvalidArgument("fused group '", name, "': ", n->Describe(), " is not elementwise");
    if (n->output()->shape() != space)
      return InvalidArgument("fused group '", name, "': ", n->Describe(), " computes ", n->output()->TypeString(),
                             ", the group iterates over ", ShapeToString(space));
    if (ComputesInIntegers(*n) != integer_domain)
      return InvalidArgument("fused group '", name, "': ", n->Describe(), " computes in another domain");
    // The node's instruction, then its rounding step if the stored dtype needs one.
    const int steps = NeedsRoundingStep(*kind, n->output()->dtype(), integer_domain) ? 2 : 1;
    for (int s = 0; s < steps; ++s, ++instrs)
      if (instrs >= kMaxBodyInstrs)
        return Unimplemented("fused group '", name, "' needs more than ", kMaxBodyInstrs, " instructions");
  }
  if (body.outputs().size() > kMaxBodyOutputs)
    return Unimplemented("fused group '", name, "' writes ", body.outputs().size(), " outputs (at most ",
                         kMaxBodyOutputs, ")");
  for (const Value* o : body.outputs())
    if (o->shape() != space)
      return InvalidArgument("fused group '", name, "': output '", o->name(), "' is not over the group's space");
  return Status::Ok();
}

}  // namespace graphfuse
