// The defaults of the Target and Executable interfaces (graphfuse/target.h), here at the bottom
// of the layers so that every backend's library links against them.
#include "graphfuse/target.h"

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

Status Executable::RunObserved(std::span<const TensorView>, std::span<const TensorView>, const NodeObserver&) {
  return Unimplemented("this target's executables do not show each node's values (their kernels do not run node by "
                       "node on host buffers)");
}

Result<double> Executable::DeviceRunMs(int, double*) {
  return Unimplemented("this target runs its kernels on the host: time its runs there");
}

Result<std::unique_ptr<Target>> Target::ForDtype(DType dtype) const {
  if (dtype == DType::kF32)
    return Unimplemented("the ", name(), " target computes models in f32 and makes no copy of itself for it");
  return Unimplemented("the ", name(), " target computes models in f32 only, not ", DTypeName(dtype));
}

Result<double> Target::CopyGbps(int64_t, int) const {
  return Unimplemented("the ", name(), " target's memory is the host's: measure the host's bandwidth");
}

Result<std::vector<std::string>> Target::WriteKernelSources(const Graph&, const std::string&) const {
  return Unimplemented("the ", name(), " target generates no kernel sources");
}

}  // namespace graphfuse
