// Run-time compilation of generated kernels with NVRTC (libnvrtc; no GPU needed), cached in
// memory and, when the caller gives a directory, on disk -- keyed by a hash of the source,
// the options and the NVRTC version, so a changed generator or toolkit never reuses stale code.
//
//   NvrtcCompiler compiler({.arch = "compute_90", .cache_dir = "/tmp/gf-kernels"});
//   GF_ASSIGN_OR_RETURN(CompiledKernel k, compiler.Compile(source));   // k.image: PTX text
//
// Thread-safe: one compiler may be shared by threads compiling different kernels.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/codegen.h"

namespace graphfuse::cuda {

struct NvrtcOptions {
  // "compute_XX" gives PTX (the driver JIT-compiles it for the GPU at hand, H200 included);
  // "sm_XX" gives a CUBIN for exactly that GPU (no JIT at load time; sm_90 = H100/H200).
  std::string arch = "compute_90";
  // Empty: the in-memory cache only. Otherwise created if missing.
  std::string cache_dir;
  // Appended after the defaults: --std=c++17 -default-device --fmad=false (a*b+c rounds
  // twice, as the CPU kernels do under -ffp-contract=off). Never --use_fast_math.
  std::vector<std::string> extra_options;
};

struct CompiledKernel {
  std::string name;   // the kernel symbol to look up in the module
  std::string image;  // PTX text (arch compute_XX) or CUBIN bytes (arch sm_XX)
  bool is_cubin = false;
  std::string log;         // NVRTC's log (warnings), empty when loaded from a cache
  bool from_cache = false;  // memory or disk
};

class NvrtcCompiler {
 public:
  explicit NvrtcCompiler(NvrtcOptions options = {});

  // Errors carry the kernel name, the arch and NVRTC's log.
  Result<CompiledKernel> Compile(const CudaKernelSource& kernel);
  Result<CompiledKernel> Compile(const std::string& name, const std::string& source);

  // The full option list passed to NVRTC.
  const std::vector<std::string>& options() const { return options_; }
  // "13.0"
  static std::string NvrtcVersion();
  // Compilations that ran NVRTC (cache misses), for tests and logs.
  int64_t nvrtc_runs() const;

 private:
  NvrtcOptions opts_;
  std::vector<std::string> options_;
  mutable std::mutex mu_;
  std::map<uint64_t, CompiledKernel> memory_;
  int64_t runs_ = 0;
};

}  // namespace graphfuse::cuda
