// Generated CUDA kernels run on the host: the kernel's source is compiled as C++ by the host
// compiler (`c++`, found on PATH) behind a shim that defines the CUDA built-ins -- thread and
// block indices, __syncthreads as a barrier of real threads, warp shuffles through shared slots,
// __shared__ as statics (blocks run one after another), float4, and the f16 / bf16 conversions
// -- and launched over a grid with one std::thread per CUDA thread. Slow, and meant for that:
// checking generated kernels and whole CUDA plans (CudaExecOptions::emulate) against the CPU
// on machines without a GPU. Math functions are the host libm's, not CUDA's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cuda/codegen.h"

namespace graphfuse {
class SharedObject;
}

namespace graphfuse::cuda {

class HostKernel {
 public:
  // Compiles `k` into a shared object under `dir` (default: the system temp directory), reusing
  // one built before for the same kernel name (the name carries a hash of the source).
  static Result<std::shared_ptr<HostKernel>> Build(const CudaKernelSource& k, const std::string& dir = "");
  // args: one pointer per pointer parameter (the node's inputs, then its outputs); sizes: the
  // values of the sizes parameter (CudaKernelSource::sizes of the node at hand); any grid.
  void Launch(std::vector<void*> args, const std::vector<int64_t>& sizes, unsigned grid,
              unsigned block = kCudaBlockSize) const;

 private:
  HostKernel() = default;
  std::shared_ptr<SharedObject> so_;
  void (*launch_)(void**, unsigned, unsigned) = nullptr;
};

}  // namespace graphfuse::cuda
