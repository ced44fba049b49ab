// Compiled generated kernels shared by every plan of one CUDA target: NVRTC's images (one
// compiler per architecture and disk cache directory, each with its memory cache by source)
// and host-emulated kernels (by kernel name, which carries a hash of the source). A model with
// symbolic dims makes a plan per input signature; generated sources take their sizes as
// parameters (codegen.h), so the plans of new lengths find their kernels here and compile none.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "cuda/codegen.h"
#include "cuda/host_emulation.h"
#include "cuda/nvrtc_compile.h"

namespace graphfuse::cuda {

class KernelCache {
 public:
  // The compiler for these options' architecture and cache directory (its extra options must be
  // the same for every call), made at the first call; it lives as long as the cache.
  NvrtcCompiler& Nvrtc(const NvrtcOptions& options);
  // `k` compiled for the host, or the kernel of that name compiled before.
  Result<std::shared_ptr<const HostKernel>> Host(const CudaKernelSource& k);
  // Kernels made so far: NVRTC compilations (cache misses) plus host kernels built (or taken
  // from their disk cache) for a name not seen before. A source met again adds nothing.
  int64_t kernels_compiled() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<NvrtcCompiler>> nvrtc_;
  std::map<std::string, std::shared_ptr<const HostKernel>> host_;
  int64_t host_built_ = 0;
};

}  // namespace graphfuse::cuda
