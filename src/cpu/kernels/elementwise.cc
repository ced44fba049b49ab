// The CPU kernels of the op table's rows (one op: one launch of RunOp) and of FusedElementwise
// (its body lowered to a tile program and run once; the executor keeps the lowered program of
// each node instead).
#include "cpu/lower_group.h"
#include "ir/op_registry.h"
#include "cpu/kernels/kernel_lists.h"

namespace graphfuse::kernels {
namespace {

Status RunElementwise(const KernelContext& ctx) {
  const OpKind kind = *OpFromName(ctx.node.op());
  return RunOp(kind, ctx.inputs, ctx.outputs[0], ElementwiseAttrs(kind, ctx.node.attrs()), ctx.cpu);
}

Status RunFused(const KernelContext& ctx) {
  GF_ASSIGN_OR_RETURN(cpu::TileProgram p, cpu::LowerElementwiseGroup(*ctx.node.GetGraph("body")));
  for (size_t k = 0; k < ctx.inputs.size(); ++k) p.inputs[k].data = ctx.inputs[k].data;
  for (size_t k = 0; k < ctx.outputs.size(); ++k) p.outputs[k].data = ctx.outputs[k].data;
  cpu::RunTileProgram(p, ctx.cpu);
  return Status::Ok();
}

}  // namespace

std::vector<CpuKernel> ElementwiseKernels() {
  std::vector<CpuKernel> out;
  for (const OpInfo& op : AllOps()) out.push_back({op.name, &RunElementwise});
  out.push_back({"FusedElementwise", &RunFused});
  return out;
}

}  // namespace graphfuse::kernels
