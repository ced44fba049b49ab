#include "cpu/cpu_target.h"

#include <mutex>

#include "ir/op_registry.h"
#include "cpu/executor.h"
#include "cpu/kernel_registry.h"
#include "graphfuse/cpu_codegen.h"
#include "graphfuse/graph.h"
#include "graphfuse/thread_pool.h"

namespace graphfuse::cpu {

struct CpuTarget::Workers {
  explicit Workers(int threads) : threads(threads) {}
  ThreadPool& pool() {
    std::call_once(made_, [this] { pool_ = std::make_unique<ThreadPool>(threads); });
    return *pool_;
  }
  const int threads;
  std::mutex run;  // held by each run: one pool, one run at a time
  // The intermediates of whichever plan runs (under `run`), grown to the largest plan's arena:
  // one arena for every plan of the target rather than one per plan.
  Tensor arena;
 private:
  std::once_flag made_;
  std::unique_ptr<ThreadPool> pool_;
};

namespace {

class CpuExecutable final : public Executable {
 public:
  CpuExecutable(std::shared_ptr<const Graph> graph, std::shared_ptr<CpuTarget::Workers> workers,
                std::unique_ptr<CpuCodegen> codegen, std::unique_ptr<ExecutionPlan> plan)
      : graph_(std::move(graph)), workers_(std::move(workers)), codegen_(std::move(codegen)), plan_(std::move(plan)) {}

  Status Run(std::span<const TensorView> inputs, std::span<const TensorView> outputs) override {
    return RunWith(inputs, outputs, nullptr);
  }
  Status RunProfiled(std::span<const TensorView> inputs, std::span<const TensorView> outputs,
                     RunProfiler& profiler) override {
    return RunWith(inputs, outputs, &profiler);
  }
  Status RunObserved(std::span<const TensorView> inputs, std::span<const TensorView> outputs,
                     const NodeObserver& observer) override {
    std::lock_guard<std::mutex> lock(workers_->run);
    GF_ASSIGN_OR_RETURN(void* arena, ExecutionPlan::GrowArena(workers_->arena, plan_->arena_bytes()));
    CpuContext ctx{&workers_->pool()};
    ctx.codegen = codegen_.get();
    return plan_->Run(inputs, outputs, ctx, &observer, arena, nullptr);
  }
  int64_t launches_per_run() const override { return plan_->stats().kernels_launched; }
  ExecutableStats stats() const override {
    const ExecStats& s = plan_->stats();
    return {.launches = s.kernels_launched,
            .activation_bytes = s.peak_activation_bytes,
            .activation_bytes_no_reuse = s.activation_bytes_no_reuse,
            .tuning_ms = s.gemm_tuning_ms,
            .tuned_classes = s.gemm_classes_timed};
  }
  // The native loops (CpuTargetOptions::codegen) compiled so far and what they left to the
  // tile executor.
  std::vector<std::string> Describe() const override {
    if (!codegen_) return {};
    return {StrCat("native loops: ", codegen_->Summary())};
  }
  bool TakesStrided(bool output, size_t index) const override { return plan_->TakesStrided(output, index); }

 private:
  Status RunWith(std::span<const TensorView> inputs, std::span<const TensorView> outputs, RunProfiler* profiler) {
    // The target's pool and arena serve one plan at a time.
    std::lock_guard<std::mutex> lock(workers_->run);
    GF_ASSIGN_OR_RETURN(void* arena, ExecutionPlan::GrowArena(workers_->arena, plan_->arena_bytes()));
    CpuContext ctx{&workers_->pool()};
    ctx.codegen = codegen_.get();
    return plan_->Run(inputs, outputs, ctx, nullptr, arena, profiler);
  }

  std::shared_ptr<const Graph> graph_;  // the plan points into it
  std::shared_ptr<CpuTarget::Workers> workers_;
  std::unique_ptr<CpuCodegen> codegen_;
  std::unique_ptr<ExecutionPlan> plan_;
};

// What the target's options ask of its plans' kernels.
PrepareOptions PrepareOptionsFor(const CpuTargetOptions& o) {
  return {.bf16_weights = o.bf16_weights, .gemm_engine = o.gemm, .threads = o.threads};
}

}  // namespace

CpuTarget::CpuTarget(const CpuTargetOptions& options)
    : options_(options), workers_(std::make_shared<Workers>(options.threads)) {}

Result<std::unique_ptr<Target>> CpuTarget::ForDtype(DType dtype) const {
  CpuTargetOptions o = options_;
  o.bf16_weights = dtype == DType::kBF16;
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return Unimplemented("the cpu target computes in f32, and in bf16 with its GEMMs' weights held in bf16; ",
                         DTypeName(dtype), " needs the cuda target (--backend cuda)");
  }
  return std::unique_ptr<Target>(new CpuTarget(o));
}

bool CpuTarget::HasKernel(const Node& node) const {
  const OpSchema* s = FindSchema(node.op());
  return s != nullptr && (s->view || FindCpuKernel(node.op()) != nullptr);
}

Status CpuTarget::EvaluateOnHost(const Node& node, std::span<const TensorView> in,
                                 std::span<const TensorView> out) const {
  return RunNodeOnce(node, in, out, CpuContext{});
}

Result<std::unique_ptr<Executable>> CpuTarget::Compile(std::shared_ptr<const Graph> graph) const {
  if (options_.threads < 0) return InvalidArgument("CPU target: threads must be >= 0 (0: the hardware's), got ", options_.threads);
  std::unique_ptr<CpuCodegen> codegen;
  if (options_.codegen) {
    GF_ASSIGN_OR_RETURN(codegen, CpuCodegen::Create());
  }
  GF_ASSIGN_OR_RETURN(std::unique_ptr<ExecutionPlan> plan,
                      ExecutionPlan::Compile(*graph, PrepareOptionsFor(options_)));
  return std::unique_ptr<Executable>(new CpuExecutable(std::move(graph), workers_, std::move(codegen), std::move(plan)));
}

std::vector<KernelChoice> CpuTarget::DescribeKernels(const Graph& graph) const {
  return DescribeCpuKernels(graph, PrepareOptionsFor(options_));
}

const Target& DefaultCpuTarget() {
  static const CpuTarget target;
  return target;
}

}  // namespace graphfuse::cpu
