// Execution: a graph is compiled once into an ExecutionPlan (kernel per node, buffers planned
// by liveness and allocated once), then run many times with no planning or allocation.
// Without fusion every node is its own kernel: the unfused baseline.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cpu/tile_program.h"
#include "graphfuse/cpu.h"
#include "cpu/kernel_registry.h"
#include "graphfuse/graph.h"
#include "graphfuse/target.h"

namespace graphfuse {

struct ExecStats {
  int64_t kernels_launched = 0;           // per run: nodes that launch a kernel (views are free)
  int64_t peak_activation_bytes = 0;      // the arena: intermediate buffers live at the peak
  int64_t activation_bytes_no_reuse = 0;  // all intermediate buffers added up, for comparison
  // Compiling it: GEMM shape classes whose engines were timed on this machine, and the time that
  // took (gemm_tuning.h; nothing where the cache had them).
  int64_t gemm_classes_timed = 0;
  double gemm_tuning_ms = 0;
};

class ExecutionPlan {
 public:
  // Plans `g` (which must stay alive and unchanged while the plan is used); `options` say how
  // the kernels prepare their nodes (bf16 GEMM weights).
  static Result<std::unique_ptr<ExecutionPlan>> Compile(const Graph& g, const PrepareOptions& options = {});

  // Called after each kernel with its node and buffers (for checks; slows the run down).
  using StepObserver =
      std::function<Status(const Node& node, std::span<const TensorView> in, std::span<const TensorView> out)>;

  // Runs on `inputs` (one per graph input, types as declared) into `outputs` (one per graph
  // output, preallocated with the declared types). Errors name the input / node / op at fault.
  // The intermediates live in `arena` when given (arena_bytes() at least, aligned to
  // kTensorAlignment): plans that never run at once, a target's, share one. Else in the plan's
  // own arena, allocated on its first run.
  // `profiler`, when given, is told each kernel's time (StepTiming).
  Status Run(std::span<const TensorView> inputs, std::span<const TensorView> outputs, const CpuContext& ctx,
             const StepObserver* observer = nullptr, void* arena = nullptr, RunProfiler* profiler = nullptr);
  // Same, allocating the outputs.
  Result<std::vector<Tensor>> Run(std::span<const TensorView> inputs, const CpuContext& ctx);

  const ExecStats& stats() const { return stats_; }
  // The bytes every intermediate buffer of a run needs (memory_plan.h).
  int64_t arena_bytes() const { return arena_bytes_; }
  // `arena` grown to at least `bytes` (its pages touched as it is allocated, not during a run);
  // returns its data. The plan's own arena and a target's shared one grow so.
  static Result<void*> GrowArena(Tensor& arena, int64_t bytes);
  const Graph& graph() const { return *graph_; }
  // Whether graph input (output = false) or output `index` may be a strided view: each node
  // that reads the input (writes the output, which nothing else reads) takes that operand
  // strided (CpuKernel::strided_inputs / strided_outputs).
  bool TakesStrided(bool output, size_t index) const {
    const std::vector<bool>& v = output ? strided_outputs_ : strided_inputs_;
    return index < v.size() && v[index];
  }

  ~ExecutionPlan();

 private:
  struct Ref;
  struct Step;
  ExecutionPlan() = default;
  Status CheckIO(std::span<const TensorView> inputs, std::span<const TensorView> outputs) const;
  void* Resolve(const Ref& r, std::span<const TensorView> inputs, std::span<const TensorView> outputs,
                char* arena) const;

  const Graph* graph_ = nullptr;
  std::vector<Step> steps_;
  int64_t arena_bytes_ = 0;
  Tensor arena_;  // the plan's own arena, when a run is given none
  std::vector<std::pair<int, int>> output_copies_;  // (graph output, ref index) needing a copy
  std::vector<Ref> output_refs_;
  std::vector<bool> strided_inputs_, strided_outputs_;
  ExecStats stats_;
};

// Compile + run once (tests, tools).
Result<std::vector<Tensor>> Execute(const Graph& g, std::span<const TensorView> inputs, const CpuContext& ctx,
                                    ExecStats* stats = nullptr);

// Runs one node's kernel on given buffers (constant folding uses it).
Status RunNodeOnce(const Node& n, std::span<const TensorView> in, std::span<const TensorView> out,
                   const CpuContext& ctx);

}  // namespace graphfuse
