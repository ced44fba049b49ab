#include "cpu/lower_group.h"

#include <map>

#include "ir/elementwise_body.h"
#include "ir/op_registry.h"
#include "ops/reference.h"

namespace graphfuse::cpu {

Result<TileProgram> LowerElementwiseGroup(const Graph& body) {
  // A valid body fits the program's capacities (tile_program.h sizes them by the body limits).
  GF_RETURN_IF_ERROR(CheckElementwiseBody(body));
  TileProgram p;
  const Shape& space = body.outputs()[0]->shape();
  p.shape = TileShape(space);

  // The group computes in one domain: that of its first node's data.
  const Domain domain = ComputesInIntegers(*body.nodes().front()) ? Domain::kI64 : Domain::kF32;
  std::map<const Value*, int> reg;
  for (const Value* in : body.inputs()) {
    reg[in] = static_cast<int>(p.inputs.size());
    p.inputs.push_back({in->dtype(), nullptr, TileStrides(in->shape(), space), domain});
  }
  auto emit = [&](TileInstr ins) {
    p.instrs.push_back(ins);
    return static_cast<int>(p.inputs.size() + p.instrs.size() - 1);
  };
  for (const auto& n : body.nodes()) {
    const OpKind kind = *OpFromName(n->op());
    TileInstr ins{kind, {0, 0, 0}, ElementwiseAttrs(kind, n->attrs()), domain};
    for (size_t a = 0; a < n->inputs().size(); ++a) ins.args[a] = reg.at(n->input(a));
    int r = emit(ins);
    const DType dt = n->output()->dtype();
    if (NeedsRoundingStep(kind, dt, domain == Domain::kI64)) {
      // The unfused op stores dt: round (or wrap) the register the same way before anyone reads it.
      OpAttrs round;
      round.to = dt;
      r = emit(TileInstr{OpKind::kCast, {r, 0, 0}, round, domain});
    }
    reg[n->output()] = r;
  }
  for (const Value* o : body.outputs()) p.outputs.push_back({reg.at(o), o->dtype(), nullptr});
  return p;
}

}  // namespace graphfuse::cpu
