#include "cuda/cuda_target.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "cuda/codegen.h"
#include "cpu/cpu_target.h"
#include "cuda/cuda_executor.h"
#include "cuda/kernel_cache.h"

namespace graphfuse::cuda {
namespace {

class CudaExecutable final : public Executable {
 public:
  CudaExecutable(std::shared_ptr<const Graph> graph, std::unique_ptr<CudaExecutor> executor,
                 const CudaTargetOptions& options)
      : graph_(std::move(graph)), executor_(std::move(executor)), options_(options) {}

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
  Result<double> DeviceRunMs(int repeats, double* median_wall_ms) override {
    std::lock_guard<std::mutex> lock(mu_);
    return executor_->MedianReplayMs(repeats, median_wall_ms);
  }
  int64_t launches_per_run() const override { return executor_->stats().launches; }
  ExecutableStats stats() const override {
    const CudaExecStats& s = executor_->stats();
    return {.launches = s.launches,
            .generated = s.generated,
            .library_calls = s.cublas,
            .host_steps = s.host_fallbacks,
            .activation_bytes = s.activation_bytes,
            .activation_bytes_no_reuse = s.activation_bytes_no_reuse,
            .device_bytes = s.device_bytes};
  }
  // A summary ("12 launches per run (9 generated kernels, 3 cuBLAS calls, 0 on the host), ...")
  // then a line per step.
  std::vector<std::string> Describe() const override {
    const CudaExecStats& s = executor_->stats();
    std::vector<std::string> lines{StrCat(s.launches, " launches per run (", s.generated, " generated kernels, ",
                                          s.cublas, " cuBLAS calls, ", s.host_fallbacks, " on the host)",
                                          options_.graph ? ", replayed as one CUDA graph" : "",
                                          options_.tf32 ? ", f32 GEMMs in TF32" : "",
                                          options_.emulate ? "; emulated on the host, no GPU used" : "")};
    for (const std::string& l : executor_->describe()) lines.push_back("  " + l);
    return lines;
  }

 private:
  std::shared_ptr<const Graph> graph_;  // the executor points into it
  std::unique_ptr<CudaExecutor> executor_;
  CudaTargetOptions options_;
  std::mutex mu_;
};

}  // namespace

CudaTarget::CudaTarget(const CudaTargetOptions& options, DType dtype)
    : options_(options), dtype_(dtype), kernels_(std::make_shared<KernelCache>()) {}

Result<std::unique_ptr<CudaTarget>> CudaTarget::Create(const CudaTargetOptions& options) {
  if (options.graph && options.emulate) return InvalidArgument("a CUDA graph cannot be emulated on the host");
  if (!options.prefill_attention.empty()) {
    GF_RETURN_IF_ERROR(ParsePrefillAttention(options.prefill_attention).status());
  }
  if (!options.emulate) {
    std::string why;
    if (!CudaDeviceAvailable(options.device, &why)) return NotFound("the cuda target: ", why);
  }
  return std::make_unique<CudaTarget>(options);
}

Result<double> CudaTarget::CopyGbps(int64_t bytes, int repeats) const {
  if (options_.emulate) return Target::CopyGbps(bytes, repeats);
  GF_ASSIGN_OR_RETURN(double ms, DeviceCopyMs(bytes, repeats, options_.device));
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

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

Result<CudaPlanOptions> CudaTarget::PlanOptions() const {
  CudaPlanOptions plan;
  plan.tf32 = options_.tf32;
  if (!options_.prefill_attention.empty()) {
    GF_ASSIGN_OR_RETURN(plan.prefill_attention, ParsePrefillAttention(options_.prefill_attention));
  }
  return plan;
}

Result<std::unique_ptr<Executable>> CudaTarget::Compile(std::shared_ptr<const Graph> graph) const {
  CudaExecOptions o;
  o.device = options_.device;
  o.cuda_graph = options_.graph;
  o.emulate = options_.emulate;
  GF_ASSIGN_OR_RETURN(o.plan, PlanOptions());
  o.kernels = kernels_;
  if (!o.emulate) {
    std::string why;
    if (!CudaDeviceAvailable(o.device, &why)) return NotFound("CUDA target: ", why);
  }
  GF_ASSIGN_OR_RETURN(std::unique_ptr<CudaExecutor> executor, CudaExecutor::Create(*graph, o));
  return std::unique_ptr<Executable>(new CudaExecutable(std::move(graph), std::move(executor), options_));
}

Result<std::vector<std::string>> CudaTarget::WriteKernelSources(const Graph& graph, const std::string& dir) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return InvalidArgument("cannot create directory '", dir, "': ", ec.message());
  GF_ASSIGN_OR_RETURN(const CudaPlanOptions plan, PlanOptions());
  std::vector<std::string> lines;
  int files = 0;
  GF_RETURN_IF_ERROR(ForEachCudaPlan(
      graph,
      [&](const Node& n, Result<CudaNodePlan>& p, int depth) -> Status {
        const std::string indent(static_cast<size_t>(2 * depth), ' ');
        char head[96];
        std::snprintf(head, sizeof head, "%s%-28s ", indent.c_str(), n.name().c_str());
        if (!p.ok()) {
          lines.push_back(StrCat(head, p.status().message(), n.GetGraph("reference") ? "; its reference graph runs:" : ""));
          return Status::Ok();
        }
        std::string kernels;
        for (const CudaKernelSource& k : p->kernels) {
          const std::filesystem::path file = std::filesystem::path(dir) / (k.name + ".cu");
          std::ofstream out(file);
          out << k.source;
          if (!out) return InvalidArgument("cannot write '", file.string(), "'");
          kernels += " " + k.name;
          ++files;
        }
        lines.push_back(StrCat(head, p->what, kernels));
        return Status::Ok();
      },
      plan));
  lines.push_back(StrCat(files, " kernel source(s) written"));
  return lines;
}

const Target& DefaultCudaTarget() {
  static const CudaTarget target;
  return target;
}

}  // namespace graphfuse::cuda
