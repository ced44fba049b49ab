#include "cuda_target.h"

#include "codegen.h"
#include "cpu/cpu_target.h"

namespace graphfuse::cuda {

bool CudaTarget::HasKernel(const Node& node) const { return PlanNodeForCuda(node).ok(); }

Status CudaTarget::EvaluateOnHost(const Node& node, std::span<const TensorView> in,
                                  std::span<const TensorView> out) const {
  return cpu::DefaultCpuTarget().EvaluateOnHost(node, in, out);
}

const Target& DefaultCudaTarget() {
  static const CudaTarget target;
  return target;
}

}  // namespace graphfuse::cuda
