#include "cpu_target.h"

#include "../ir/op_registry.h"
#include "executor.h"
#include "graphfuse/graph.h"

namespace graphfuse::cpu {

bool CpuTarget::HasKernel(const Node& node) const {
  const OpSchema* s = FindSchema(node.op());
  return s != nullptr && (s->view || s->kernel != nullptr);
}

Status CpuTarget::EvaluateOnHost(const Node& node, std::span<const TensorView> in,
                                 std::span<const TensorView> out) const {
  return RunNodeOnce(node, in, out, CpuContext{});
}

const Target& DefaultCpuTarget() {
  static const CpuTarget target;
  return target;
}

}  // namespace graphfuse::cpu
