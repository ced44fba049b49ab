#include "cuda_target.h"

#include <cstring>
#include <mutex>

#include "codegen.h"
#include "cpu/cpu_target.h"
#include "cuda_executor.h"
#include "kernel_cache.h"

namespace graphfuse::cuda {
namespace {

class CudaExecutable final : public Executable {
 public:
  CudaExecutable(std::shared_ptr<const Graph> graph, std::unique_ptr<CudaExecutor> executor)
      : graph_(std::move(graph)), executor_(std::move(executor)) {}

  Status Run(std::span<const TensorView> inputs, std::span<const TensorView> outputs) override {
    if (outputs.size() != graph_->outputs().size())
      return InvalidArgument("the graph has ", graph_->outputs().size(), " outputs, got ", outputs.size(), " buffers");
    for (size_t i = 0; i < outputs.size(); ++i) {
      const Value* v = graph_->outputs()[i];
      if (outputs[i].dtype != v->dtype() || outputs[i].shape != v->shape())
        return InvalidArgument("output ", i, " ('", v->name(), "') is ", v->TypeString(), ", got a buffer of ",
                               DTypeName(outputs[i].dtype), ShapeToString(outputs[i].shape));
    }
    std::vector<Tensor> got;
    {
      std::lock_guard<std::mutex> lock(mu_);  // one stream, one set of device buffers
      GF_ASSIGN_OR_RETURN(got, executor_->Run(inputs));
    }
    for (size_t i = 0; i < outputs.size(); ++i) std::memcpy(outputs[i].data, got[i].data(), got[i].nbytes());
    return Status::Ok();
  }
  // The run, then its steps replayed one by one between CUDA events for their device times (an
  // emulated plan has none: its run is one host-timed step).
  Status RunProfiled(std::span<const TensorView> inputs, std::span<const TensorView> outputs,
                     RunProfiler& profiler) override {
    const int64_t start_ns = SteadyClockNs();
    GF_RETURN_IF_ERROR(Run(inputs, outputs));
    const int64_t end_ns = SteadyClockNs();
    Result<std::vector<StepTiming>> steps = [&] {
      std::lock_guard<std::mutex> lock(mu_);
      return executor_->DeviceSteps(start_ns);
    }();
    if (!steps.ok()) {
      profiler.OnStep(StepTiming{nullptr, "run", start_ns, end_ns - start_ns, false});
      return Status::Ok();
    }
    for (const StepTiming& t : *steps) profiler.OnStep(t);
    return Status::Ok();
  }
  int64_t launches_per_run() const override { return executor_->stats().launches; }

 private:
  std::shared_ptr<const Graph> graph_;  // the executor points into it
  std::unique_ptr<CudaExecutor> executor_;
  std::mutex mu_;
};

}  // namespace

CudaTarget::CudaTarget(const TargetOptions& options, DType dtype)
    : options_(options), dtype_(dtype), kernels_(std::make_shared<KernelCache>()) {}

Result<std::unique_ptr<Target>> CudaTarget::ForDtype(DType dtype) const {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16)
    return Unimplemented("the cuda target computes in f32, bf16 or f16, not ", DTypeName(dtype));
  return std::unique_ptr<Target>(new CudaTarget(options_, dtype));
}

bool CudaTarget::HasKernel(const Node& node) const { return PlanNodeForCuda(node).ok(); }

Status CudaTarget::EvaluateOnHost(const Node& node, std::span<const TensorView> in,
                                  std::span<const TensorView> out) const {
  return cpu::DefaultCpuTarget().EvaluateOnHost(node, in, out);
}

Result<std::unique_ptr<Executable>> CudaTarget::Compile(std::shared_ptr<const Graph> graph) const {
  CudaExecOptions o;
  o.device = options_.device;
  o.cuda_graph = options_.cuda_graph;
  o.emulate = options_.emulate;
  o.plan.tf32 = options_.cuda_tf32;
  o.kernels = kernels_;
  if (!o.emulate) {
    std::string why;
    if (!CudaDeviceAvailable(o.device, &why)) return NotFound("CUDA target: ", why);
  }
  GF_ASSIGN_OR_RETURN(std::unique_ptr<CudaExecutor> executor, CudaExecutor::Create(*graph, o));
  return std::unique_ptr<Executable>(new CudaExecutable(std::move(graph), std::move(executor)));
}

const Target& DefaultCudaTarget() {
  static const CudaTarget target;
  return target;
}

}  // namespace graphfuse::cuda
