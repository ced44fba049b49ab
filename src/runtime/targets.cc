// The backends of this build, by name: the one place that knows which were compiled in.
#include "cpu/cpu_target.h"
#include "graphfuse/target.h"
#include "runtime/host_target.h"
#ifdef GF_HAVE_CUDA
#include "cuda/cuda_target.h"
#endif

namespace graphfuse {

Status Executable::RunProfiled(std::span<const TensorView> inputs, std::span<const TensorView> outputs,
                               RunProfiler& profiler) {
  StepTiming step;
  step.label = "run";
  step.start_ns = SteadyClockNs();
  Status st = Run(inputs, outputs);
  step.duration_ns = SteadyClockNs() - step.start_ns;
  if (st.ok()) profiler.OnStep(step);
  return st;
}

Result<std::unique_ptr<Target>> Target::ForDtype(DType dtype) const {
  if (dtype == DType::kF32) return MakeTarget(name());
  return Unimplemented("the ", name(), " target computes models in f32 only, not ", DTypeName(dtype));
}

const Target& HostTarget() { return cpu::DefaultCpuTarget(); }

std::vector<std::string> TargetNames() {
#ifdef GF_HAVE_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

Result<std::unique_ptr<Target>> MakeTarget(std::string_view name, const TargetOptions& options) {
  if (name == "cpu") return std::unique_ptr<Target>(new cpu::CpuTarget(options));
#ifdef GF_HAVE_CUDA
  if (name == "cuda") return std::unique_ptr<Target>(new cuda::CudaTarget(options));
#endif
  std::string names;
  for (const std::string& n : TargetNames()) names += (names.empty() ? "" : ", ") + n;
  return NotFound("no target '", std::string(name), "' in this build (targets: ", names, ")");
}

}  // namespace graphfuse
