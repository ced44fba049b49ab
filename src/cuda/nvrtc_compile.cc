#include "core/hash.h"
#include "cuda/nvrtc_compile.h"

#include <nvrtc.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/shared_object.h"

namespace graphfuse::cuda {
namespace {

// The program's log; empty when there is none.
std::string ProgramLog(nvrtcProgram prog) {
  size_t size = 0;
  if (nvrtcGetProgramLogSize(prog, &size) != NVRTC_SUCCESS || size <= 1) return "";
  std::string log(size, '\0');
  if (nvrtcGetProgramLog(prog, log.data()) != NVRTC_SUCCESS) return "";
  log.resize(size - 1);  // the terminating NUL
  return log;
}

// Writes via a temporary file and a rename, so that a reader never sees half a file (other
// processes may share the cache directory).
void WriteFileAtomic(const std::filesystem::path& p, const std::string& data) {
  std::error_code ec;
  std::filesystem::create_directories(p.parent_path(), ec);
  std::ostringstream tid;
  tid << std::this_thread::get_id();
  const std::filesystem::path tmp = p.string() + ".tmp" + tid.str();
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return;  // the disk cache is an optimisation: failing to write it is not an error
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!f) return;
  }
  std::filesystem::rename(tmp, p, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

}  // namespace

NvrtcCompiler::NvrtcCompiler(NvrtcOptions options) : opts_(std::move(options)) {
  options_ = {"--gpu-architecture=" + opts_.arch, "--std=c++17", "-default-device", "--fmad=false"};
  for (const std::string& o : opts_.extra_options) options_.push_back(o);
}

std::string NvrtcCompiler::NvrtcVersion() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "unknown";
  return StrCat(major, ".", minor);
}

int64_t NvrtcCompiler::nvrtc_runs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return runs_;
}

Result<CompiledKernel> NvrtcCompiler::Compile(const CudaKernelSource& kernel) {
  return Compile(kernel.name, kernel.source);
}

Result<CompiledKernel> NvrtcCompiler::Compile(const std::string& name, const std::string& source) {
  const bool cubin = opts_.arch.rfind("sm_", 0) == 0;
  uint64_t key = Fnv1a64(source);
  for (const std::string& o : options_) key = Fnv1a64(o + '\n', key);
  key = Fnv1a64(NvrtcVersion(), key);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = memory_.find(key);
    if (it != memory_.end() && it->second.name == name) {
      CompiledKernel k = it->second;
      k.from_cache = true;
      return k;
    }
  }
  char hex[24];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(key));
  const std::filesystem::path file = opts_.cache_dir.empty()
                                         ? std::filesystem::path()
                                         : std::filesystem::path(opts_.cache_dir) / StrCat(name, "_", hex, cubin ? ".cubin" : ".ptx");
  CompiledKernel k;
  k.name = name;
  k.is_cubin = cubin;
  if (!file.empty() && ReadFile(file, &k.image) && !k.image.empty()) {
    k.from_cache = true;
  } else {
    const std::string what = StrCat("NVRTC ", NvrtcVersion(), " compiling kernel '", name, "' for ", opts_.arch);
    nvrtcProgram prog = nullptr;
    nvrtcResult rc = nvrtcCreateProgram(&prog, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr);
    if (rc != NVRTC_SUCCESS) return Internal(what, ": nvrtcCreateProgram: ", nvrtcGetErrorString(rc));
    std::vector<const char*> argv;
    for (const std::string& o : options_) argv.push_back(o.c_str());
    rc = nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
    k.log = ProgramLog(prog);
    if (rc == NVRTC_SUCCESS) {
      size_t size = 0;
      rc = cubin ? nvrtcGetCUBINSize(prog, &size) : nvrtcGetPTXSize(prog, &size);
      if (rc == NVRTC_SUCCESS) {
        k.image.assign(size, '\0');
        rc = cubin ? nvrtcGetCUBIN(prog, k.image.data()) : nvrtcGetPTX(prog, k.image.data());
        if (!cubin && !k.image.empty() && k.image.back() == '\0') k.image.pop_back();
      }
    }
    nvrtcDestroyProgram(&prog);
    if (rc != NVRTC_SUCCESS)
      return Internal(what, " failed (", nvrtcGetErrorString(rc), "); options:", [&] {
        std::string s;
        for (const std::string& o : options_) s += " " + o;
        return s;
      }(), "\n", k.log);
    if (!file.empty()) WriteFileAtomic(file, k.image);
    std::lock_guard<std::mutex> lock(mu_);
    ++runs_;
  }
  std::lock_guard<std::mutex> lock(mu_);
  memory_[key] = k;
  return k;
}

}  // namespace graphfuse::cuda
