// The CUDA plan under construction, which every node's planner appends to: the steps one run
// performs in order, one line per node saying how it runs, the stats, the memory, and the
// handles the steps use. A generated kernel becomes a step here: compiled with NVRTC for the
// device's architecture and loaded through the runtime API (once per kernel name), or, in an
// emulated plan, compiled for the host (host_emulation.h).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda/codegen.h"
#include "cuda/cuda_executor.h"
#include "cuda/cuda_gemm.h"
#include "cuda/device_memory.h"
#include "cuda/host_emulation.h"
#include "cuda/kernel_cache.h"
#include "cuda/nvrtc_compile.h"

namespace graphfuse::cuda {

// One step of a run: a launch, a cuBLAS call, a copy, or a node run on the host.
struct Step {
  std::string label;
  std::function<Status(cudaStream_t)> run;
  bool host = false;  // synchronizes with the host (no CUDA-graph capture)
};

class PlanBuilder {
 public:
  // `emulate`: host memory, host-compiled kernels, host GEMMs (CudaExecOptions::emulate).
  explicit PlanBuilder(bool emulate) : emu(emulate), memory(emulate) {}
  ~PlanBuilder();
  PlanBuilder(const PlanBuilder&) = delete;
  PlanBuilder& operator=(const PlanBuilder&) = delete;

  // A step launching generated kernel `k` on the given device pointers (its parameters); no
  // step for a kernel over no elements.
  Status AddKernelStep(const std::string& label, const CudaKernelSource& k, std::vector<void*> args);
  // The buffers of a node's inputs, then of its outputs (Unimplemented for an omitted optional
  // input).
  Result<std::vector<void*>> NodeBuffers(const Node& n);
  // The GEMMs the steps run, of `ab` operands into `c` results: cuBLAS on `blas` (none when
  // emulating: on the host); f32 ones in TF32 with `tf32`.
  Gemm gemm(DType ab = DType::kF32, DType c = DType::kF32) const { return Gemm{blas, ab, c, tf32}; }

  // The plan and what its steps use: set up by CudaExecutor::Create, appended to by the node
  // planners (cuda_gemm_plan.h, cuda_attention_plan.h, host_fallback.h, cuda_executor.cc).
  const bool emu;
  DeviceMemory memory;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* blas_workspace = nullptr;
  size_t blas_workspace_bytes = size_t{32} << 20;
  std::shared_ptr<KernelCache> kernel_cache;    // compiled kernels (shared with other plans)
  NvrtcCompiler* compiler = nullptr;            // on a GPU: kernel_cache's for the device
  int sms = 1;                                  // the device's multiprocessors (grid sizes)
  bool tf32 = false;                            // f32 GEMMs in TF32 (CudaPlanOptions::tf32)
  std::vector<std::function<void()>> cleanups;  // cuBLASLt descriptors, released with the plan

  std::vector<Step> steps;
  std::vector<std::string> lines;  // CudaExecutor::describe()
  CudaExecStats stats;

 private:
  Result<cudaKernel_t> Load(const CudaKernelSource& k);

  std::map<std::string, cudaKernel_t> kernels_;  // by kernel name (identical groups share one)
  std::vector<cudaLibrary_t> libraries_;
};

}  // namespace graphfuse::cuda
