// The CPU backend's kernel registry: for every op the CPU runs, its kernel and the optional
// work done once per node when a plan is compiled. The op's semantics (arity, inference, whether
// it is a view) live in the op registry (src/ir/op_registry.h); an op that is a view has no
// kernel here.
//
// The registry is an immutable table built once; nothing registers at run time.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "graphfuse/cpu.h"
#include "graphfuse/graph.h"
#include "graphfuse/target.h"

namespace graphfuse {

// What a kernel sees: the node and views of its input and output buffers (data of omitted
// optional inputs is null; outputs are preallocated with the inferred types).
struct KernelContext {
  const Node& node;
  std::span<const TensorView> inputs;
  std::span<const TensorView> outputs;
  const CpuContext& cpu;
  const void* state = nullptr;  // what the kernel's `prepare` made for this node (null if none)
};

using KernelFn = Status (*)(const KernelContext& ctx);
// How a plan's kernels prepare their nodes (ExecutionPlan::Compile's options).
struct PrepareOptions {
  // GEMMs against constant weights hold them in bf16 (rounded once, when packed; activations and
  // sums stay f32): half the weight stream of a decode step.
  bool bf16_weights = false;
  // Which engine runs the GEMMs against constant weights (CpuTargetOptions::gemm, whose default
  // times them). A plan compiled without a target takes the rule: nothing timed, so that two
  // plans of one graph compiled apart choose alike.
  CpuGemmEngine gemm_engine = CpuGemmEngine::kRule;
  // The threads the plan runs on (CpuTargetOptions::threads; 0: the hardware's): the GEMM
  // engines are timed with as many (gemm_tuning.h).
  int threads = 0;
  // Where packed weights are kept, shared by every plan of a model (ExecutionPlan::Compile
  // takes the graph's prepared_store() when this is null); null: each plan packs its own.
  PreparedStore* store = nullptr;
};
// Work done once per node when a plan is compiled (weights packed for the GEMM, ...). The
// kernel must also run without it (nullptr state: constant folding, one-off runs).
using PrepareFn = Result<std::shared_ptr<const void>> (*)(const Node& node, const PrepareOptions& options);
// How the kernel runs `node` where it chooses among ways (which library or loop runs its GEMMs,
// and why), in one line for `graphfuse explain`; empty where it has nothing to choose.
using DescribeFn = std::string (*)(const Node& node, const PrepareOptions& options);

struct CpuKernel {
  const char* op;
  KernelFn run;
  PrepareFn prepare = nullptr;
  DescribeFn describe = nullptr;
  // Bit i set: input (output) i may be a strided view (TensorView::strides, last dim
  // contiguous), which the kernel reads (writes) through its strides. The executor hands a
  // graph input or output on strided only where every kernel that touches it takes it so.
  uint32_t strided_inputs = 0, strided_outputs = 0;
};

// Every node of `g` whose CPU kernel tells how it runs it with these options, in graph order.
std::vector<KernelChoice> DescribeCpuKernels(const Graph& g, const PrepareOptions& options);

// The kernel of `op`, or nullptr (a view, or an op the CPU does not run).
const CpuKernel* FindCpuKernel(std::string_view op);
std::vector<const CpuKernel*> AllCpuKernels();

}  // namespace graphfuse
