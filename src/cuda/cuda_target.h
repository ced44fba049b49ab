// The CUDA backend as a Target: its kernel registry is PlanNodeForCuda (generated kernels,
// cuBLAS / cuBLASLt GEMMs); fusion is priced at an H200's launch cost and bandwidth; it asks
// for no CPU-only form (a norm folded into GEMMs, the QKV projection inside attention), so its
// plans keep those as separate nodes with CUDA paths. Host evaluation (constant folding) runs
// the CPU kernels.
#pragma once

#include <memory>

#include "graphfuse/target.h"

namespace graphfuse::cuda {

class KernelCache;
struct CudaPlanOptions;

class CudaTarget final : public Target {
 public:
  // `dtype`: what models are converted to before the passes (f32: none). Create checks the
  // options and the device; the constructor takes them as given.
  explicit CudaTarget(const CudaTargetOptions& options = {}, DType dtype = DType::kF32);
  // InvalidArgument for options that contradict (a CUDA graph emulated, an unknown attention
  // form), NotFound when the device cannot be used and emulation is off.
  static Result<std::unique_ptr<CudaTarget>> Create(const CudaTargetOptions& options);
  std::string_view name() const override { return "cuda"; }
  // Per launch: the launch time saved by replaying the LLaMA block's launches as one CUDA
  // graph; bandwidth: a device-to-device copy (bench/RESULTS.md, "CUDA on the H200").
  TargetCosts costs() const override { return {1.2, 4000.0}; }
  TargetForms forms() const override { return {.narrow_row_kernels = true}; }
  bool HasKernel(const Node& node) const override;
  Status EvaluateOnHost(const Node& node, std::span<const TensorView> in,
                        std::span<const TensorView> out) const override;
  // A CudaExecutor (inputs copied to the device, outputs back); calls take turns.
  Result<std::unique_ptr<Executable>> Compile(std::shared_ptr<const Graph> graph) const override;
  // bf16 / f16: the model converted to that dtype before the passes (ConvertPrecision: weights
  // converted once, f32 inputs and outputs cast at the edges); its kernels load the narrow dtype
  // and sum in f32.
  Result<std::unique_ptr<Target>> ForDtype(DType dtype) const override;
  DType graph_dtype() const override { return dtype_; }
  // The kernels its plans compiled, shared by all of them (kernel_cache.h).
  const KernelCache& kernel_cache() const { return *kernels_; }
  // A device-to-device copy (none when emulated: the host's memory is measured there).
  Result<double> CopyGbps(int64_t bytes, int repeats) const override;
  // Each node's CUDA path (ForEachCudaPlan) and its generated kernels' sources, NAME.cu.
  Result<std::vector<std::string>> WriteKernelSources(const Graph& graph, const std::string& dir) const override;

 private:
  // What its options ask of each plan (TF32 GEMMs, the prefill attention's form).
  Result<CudaPlanOptions> PlanOptions() const;

  CudaTargetOptions options_;
  DType dtype_ = DType::kF32;
  std::shared_ptr<KernelCache> kernels_;
};

// A CUDA target with its defaults (immutable; lives for the process).
const Target& DefaultCudaTarget();

}  // namespace graphfuse::cuda
