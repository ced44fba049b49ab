// The CPU backend as a Target: its kernel registry (the op schemas' CPU kernels, views free),
// the cost of a launch on the thread pool and of memory traffic, and the fused forms only its
// kernels run (an RMSNorm folded into the GEMMs around it, the QKV projection inside the
// attention kernel).
#pragma once

#include "graphfuse/target.h"

namespace graphfuse::cpu {

class CpuTarget final : public Target {
 public:
  explicit CpuTarget(const CpuTargetOptions& options = {});
  std::string_view name() const override { return "cpu"; }
  // A launch on the thread pool costs about 1 us; fused traffic is priced at 40 GB/s.
  TargetCosts costs() const override { return {1.0, 40.0}; }
  TargetForms forms() const override { return {.norm_into_gemm = true, .attention_projection = true}; }
  bool HasKernel(const Node& node) const override;
  Status EvaluateOnHost(const Node& node, std::span<const TensorView> in,
                        std::span<const TensorView> out) const override;
  // An ExecutionPlan on the target's thread pool, which every plan it compiles shares (a model's
  // plans for many shapes, a decode loop's plan per length: one set of threads, started once);
  // runs from several threads, of one plan or of several, take turns (each run already uses
  // every thread of the pool).
  Result<std::unique_ptr<Executable>> Compile(std::shared_ptr<const Graph> graph) const override;
  // Which engine runs each GEMM (with options.bf16_weights), and why.
  std::vector<KernelChoice> DescribeKernels(const Graph& graph) const override;
  // bf16: the same target with options.bf16_weights (activations and sums stay f32); f16:
  // refused (the CPU kernels compute f32).
  Result<std::unique_ptr<Target>> ForDtype(DType dtype) const override;
  // Every fused node has a CPU kernel, and none reads a reference graph.
  bool ReadsReferenceGraphs() const override { return false; }
  // In f32 (no bf16 weights), its results are the reference.
  bool is_reference() const override { return !options_.bf16_weights; }

  // What its executables share: the thread pool (made on the first run), the arena their
  // intermediates live in (grown to the largest plan's), and the lock their runs take turns on.
  struct Workers;

 private:
  CpuTargetOptions options_;
  std::shared_ptr<Workers> workers_;
};

// A CPU target with its defaults (immutable; lives for the process).
const Target& DefaultCpuTarget();

}  // namespace graphfuse::cpu
