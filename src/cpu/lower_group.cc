#include "lower_group.h"

#include <map>

#include "../ir/op_registry.h"
#include "../ops/reference.h"

namespace graphfuse::cpu {

Result<TileProgram> LowerElementwiseGroup(const Graph& body) {
  TileProgram p;
  if (body.outputs().empty()) return InvalidArgument("fused group '", body.name(), "' has no outputs");
  const Shape& space = body.outputs()[0]->shape();
  if (space.size() > kMaxTileRank) return Unimplemented("fused group '", body.name(), "': rank ", space.size());
  p.shape = TileShape(space);

  // The group computes in one domain: that of its first node's data.
  if (body.nodes().empty()) return InvalidArgument("fused group '", body.name(), "' has no nodes");
  std::map<const Value*, int> reg;
  auto node_domain = [](const Node& n) {
    const OpKind kind = *OpFromName(n.op());
    std::vector<DType> dtypes;
    for (const Value* in : n.inputs()) dtypes.push_back(in->dtype());
    return ComputesInIntegers(kind, dtypes) ? Domain::kI64 : Domain::kF32;
  };
  const Domain domain = node_domain(*body.nodes().front());

  if (body.inputs().size() > kMaxTileInputs)
    return Unimplemented("fused group '", body.name(), "' reads ", body.inputs().size(), " inputs (at most ", kMaxTileInputs, ")");
  for (const Value* in : body.inputs()) {
    if (in->shape().size() > space.size())
      return InvalidArgument("fused group '", body.name(), "': input '", in->name(), "' has a larger rank than the group");
    reg[in] = static_cast<int>(p.inputs.size());
    p.inputs.push_back({in->dtype(), nullptr, TileStrides(in->shape(), space), domain});
  }
  if (!body.constants().empty())
    return InvalidArgument("fused group '", body.name(), "' holds constants; they must be inputs");

  auto emit = [&](TileInstr ins) -> Result<int> {
    if (p.instrs.size() >= kMaxTileInstrs)
      return Unimplemented("fused group '", body.name(), "' needs more than ", kMaxTileInstrs, " instructions");
    p.instrs.push_back(ins);
    return static_cast<int>(p.inputs.size() + p.instrs.size() - 1);
  };
  for (const auto& n : body.nodes()) {
    auto kind = OpFromName(n->op());
    if (!kind.ok()) return InvalidArgument("fused group '", body.name(), "': ", n->Describe(), " is not elementwise");
    if (n->output()->shape() != space)
      return InvalidArgument("fused group '", body.name(), "': ", n->Describe(), " computes ",
                             n->output()->TypeString(), ", the group iterates over ", ShapeToString(space));
    if (node_domain(*n) != domain)
      return InvalidArgument("fused group '", body.name(), "': ", n->Describe(), " computes in another domain");
    TileInstr ins{*kind, {0, 0, 0}, ElementwiseAttrs(*kind, n->attrs()), domain};
    for (size_t a = 0; a < n->inputs().size(); ++a) ins.args[a] = reg.at(n->input(a));
    GF_ASSIGN_OR_RETURN(int r, emit(ins));
    const DType dt = n->output()->dtype();
    if (NeedsRoundingStep(*kind, dt, domain == Domain::kI64)) {
      // The unfused op stores dt: round (or wrap) the register the same way before anyone reads it.
      OpAttrs round;
      round.to = dt;
      GF_ASSIGN_OR_RETURN(r, emit(TileInstr{OpKind::kCast, {r, 0, 0}, round, domain}));
    }
    reg[n->output()] = r;
  }
  if (body.outputs().size() > kMaxTileOutputs)
    return Unimplemented("fused group '", body.name(), "' writes ", body.outputs().size(), " outputs (at most ",
                         kMaxTileOutputs, ")");
  for (const Value* o : body.outputs()) {
    if (o->shape() != space)
      return InvalidArgument("fused group '", body.name(), "': output '", o->name(), "' is not over the group's space");
    p.outputs.push_back({reg.at(o), o->dtype(), nullptr});
  }
  return p;
}

}  // namespace graphfuse::cpu
