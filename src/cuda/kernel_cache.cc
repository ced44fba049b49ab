#include "cuda/kernel_cache.h"

namespace graphfuse::cuda {

NvrtcCompiler& KernelCache::Nvrtc(const NvrtcOptions& options) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<NvrtcCompiler>& c = nvrtc_[options.arch + '\n' + options.cache_dir];
  if (!c) c = std::make_unique<NvrtcCompiler>(options);
  return *c;
}

Result<std::shared_ptr<const HostKernel>> KernelCache::Host(const CudaKernelSource& k) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = host_.find(k.name); it != host_.end()) return it->second;
  }
  // Built without the lock: another thread may build the same kernel meanwhile, and the first
  // one stored is kept.
  GF_ASSIGN_OR_RETURN(std::shared_ptr<HostKernel> built, HostKernel::Build(k));
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, fresh] = host_.emplace(k.name, std::move(built));
  if (fresh) ++host_built_;
  return it->second;
}

int64_t KernelCache::kernels_compiled() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = host_built_;
  for (const auto& [key, c] : nvrtc_) n += c->nvrtc_runs();
  return n;
}

}  // namespace graphfuse::cuda
