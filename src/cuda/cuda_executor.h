// Runs a graph (fused or not) on one CUDA device.
//
// Create() plans every node by its PlanNodeForCuda path (codegen.h): generated kernels are
// compiled with NVRTC for the device's architecture (memory / disk cache) and loaded through
// the runtime API (cudaLibraryLoadData: no link-time dependency on the driver, so a build with
// the backend still runs on machines without a GPU); GEMMs go to cuBLAS, or to cuBLASLt with
// its bias / ReLU / GELU-tanh epilogue where that enum computes the group exactly; a FusedGemm
// epilogue it does not cover runs as one generated kernel right after the GEMM. A fused node
// whose kernel cannot be generated (say, attention over more keys than the generated kernel
// holds) runs its "reference" graph, each op by its own path; attention with many query rows
// per head runs as one flash-style kernel (GenerateFlashAttentionKernel), or as two generated
// kernels around two strided-batched cuBLAS GEMMs (GenerateAttentionGemmKernels) when
// CudaPlanOptions::prefill_attention asks for them or the flash kernel refuses the node; an op with no CUDA path at all runs on the host between copies (reported, and refused under CUDA-graph capture). Graph inputs,
// outputs and constants get device buffers of their own (constants uploaded once); views share
// their input's; values between nodes and per-node scratch share pooled blocks by liveness
// (device_memory.h, with the planner of src/memory/memory_plan.h).
//
// Run(): inputs host -> device, the launches on one stream (or the whole plan replayed as one
// CUDA graph), outputs device -> host.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cuda/codegen.h"
#include "graphfuse/graph.h"
#include "graphfuse/target.h"
#include "graphfuse/tensor.h"

namespace graphfuse::cuda {

class KernelCache;

// Whether device `device` can be used; when not, `why` (if given) says why, e.g. "no CUDA
// device (cudaGetDeviceCount: ...)".
bool CudaDeviceAvailable(int device = 0, std::string* why = nullptr);

// Median device time (ms, CUDA events) of copying `bytes` device to device, over `repeats`
// copies: the same-run bandwidth anchor for GB/s figures (2 x bytes moved per copy).
Result<double> DeviceCopyMs(int64_t bytes, int repeats, int device = 0);

struct CudaExecOptions {
  int device = 0;
  bool cuda_graph = false;       // capture the launches once, replay them as one CUDA graph
  std::string kernel_cache_dir;  // NVRTC disk cache; empty: $GF_KERNEL_CACHE if set, else memory only
  CudaPlanOptions plan;          // which path a node takes where it has two (attention)
  // Run the plan on the host instead (no GPU needed, slow): host memory, the generated kernels
  // compiled as C++ and run by host threads (host_emulation.h), GEMMs in double on the host,
  // cuBLASLt's epilogues as generated kernels (a residual as cuBLASLt's C: the same one step, on
  // the host). Checks the plan and every kernel it launches.
  bool emulate = false;
  // Compiled kernels shared with other plans (a CudaTarget's, across its input signatures);
  // null: the executor's own.
  std::shared_ptr<KernelCache> kernels;
};

struct CudaExecStats {
  int64_t launches = 0;          // per run: generated kernels + cuBLAS calls + host fallbacks
  int64_t generated = 0;         // generated-kernel launches
  int64_t cublas = 0;            // cuBLAS / cuBLASLt calls
  int64_t host_fallbacks = 0;    // nodes run on the host between copies
  int64_t reference_graphs = 0;  // fused nodes run through their reference graph
  int64_t device_bytes = 0;      // device memory held (buffers, constants, workspaces)
  // Values between nodes and per-node scratch share blocks by liveness: the blocks' bytes, and
  // what every such buffer would add up to without reuse.
  int64_t activation_bytes = 0, activation_bytes_no_reuse = 0;
  double compile_seconds = 0;    // NVRTC time at Create (0 when every kernel came from a cache)
};

class CudaExecutor {
 public:
  // `g` must stay alive and unchanged while the executor is used.
  static Result<std::unique_ptr<CudaExecutor>> Create(const Graph& g, const CudaExecOptions& options = {});
  ~CudaExecutor();

  // One run: one input per graph input (types as declared); returns the graph's outputs.
  Result<std::vector<Tensor>> Run(std::span<const TensorView> inputs);
  // The device work of one run again, on the inputs of the last Run (for timing: no copies);
  // waits for it and returns the elapsed device time in milliseconds (CUDA events). With
  // `wall_ms`, also the host's time from the first launch to the end of the wait (what a
  // framework timed as "call, then synchronize" sees; launch costs included).
  Result<double> Replay(double* wall_ms = nullptr);
  // The median of `repeats` (at least 1) Replay() times; `median_wall_ms`, the median wall time.
  Result<double> MedianReplayMs(int repeats, double* median_wall_ms = nullptr);
  // Per step (a launch, a cuBLAS call, a copy), in plan order: its label and the median over
  // `repeats` replays of the device time between events recorded around it. Launched one by one
  // (a plan captured as a CUDA graph is timed as the plan it was captured from).
  Result<std::vector<std::pair<std::string, double>>> ProfileSteps(int repeats);
  // One replay's steps as a profiler records them (StepTiming, graphfuse/target.h): each step's
  // device time, the steps laid end to end from `start_ns`, labelled by their node's name.
  // Unimplemented for an emulated plan, as ProfileSteps.
  Result<std::vector<StepTiming>> DeviceSteps(int64_t start_ns);

  const CudaExecStats& stats() const;
  // One line per step: what runs and how ("fused_gemm_3: cuBLAS GEMM, then the generated
  // epilogue epilogue_gemm_...").
  const std::vector<std::string>& describe() const;

 private:
  struct Impl;
  explicit CudaExecutor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace graphfuse::cuda
