// The backends of this build, by name: the one place that knows which were compiled in.
#include "cpu/cpu_target.h"
#include "graphfuse/target.h"
#include "runtime/host_target.h"
#ifdef GF_HAVE_CUDA
#include "cuda/cuda_target.h"
#endif

namespace graphfuse {

const Target& HostTarget() { return cpu::DefaultCpuTarget(); }

std::vector<std::string> TargetNames() {
#ifdef GF_HAVE_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

Result<std::unique_ptr<Target>> MakeTarget(std::string_view name, const TargetOptions& options) {
  if (name != "cuda" && !(options.cuda == CudaTargetOptions{}))
    return InvalidArgument("the cuda target's options (device, CUDA graph, emulation, TF32, attention form: "
                           "--cuda-graph, --emulate-gpu, --tf32, --cuda-attention) do not apply to the ",
                           std::string(name), " target");
  if (name == "cpu") return std::unique_ptr<Target>(new cpu::CpuTarget(options.cpu));
  if (name == "cuda") {
#ifdef GF_HAVE_CUDA
    GF_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaTarget> target, cuda::CudaTarget::Create(options.cuda));
    return std::unique_ptr<Target>(std::move(target));
#else
    return Unimplemented("this build has no CUDA backend (no CUDA toolkit when it was built)");
#endif
  }
  std::string names;
  for (const std::string& n : TargetNames()) names += (names.empty() ? "" : ", ") + n;
  return NotFound("no target '", std::string(name), "' in this build (targets: ", names, ")");
}

std::unique_ptr<Target> MakeReferenceTarget(const TargetOptions& options) {
  CpuTargetOptions cpu = options.cpu;
  cpu.bf16_weights = false;
  return std::unique_ptr<Target>(new cpu::CpuTarget(cpu));
}

}  // namespace graphfuse
