// Native code built at run time: C++ source compiled by the host compiler into a shared
// object, cached on disk under a name that carries a hash of everything that went into it,
// and loaded with dlopen. Used by the CPU code generator (cpu/cpu_codegen.h) and by the host
// emulation of generated CUDA kernels (cuda/host_emulation.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "graphfuse/status.h"

namespace graphfuse {

// The whole file, bytes as they are; false when it cannot be read.
bool ReadFile(const std::filesystem::path& p, std::string* out);

// A path as one shell word: in single quotes, any single quote in it escaped.
std::string ShellQuote(const std::string& path);

// Builds dir/stem.so from `source` with `compile` (a shell command prefix that ends before the
// output and input files, e.g. "c++ -O2 -fPIC -shared") followed by `libs` (e.g. "-lm"),
// unless that file exists already.
// The object is built under a unique name and renamed, so concurrent builders never see a
// partial file. `built` (optional) says whether a compile ran. Errors carry the compiler's log.
Result<std::filesystem::path> BuildSharedObject(const std::string& source, const std::string& compile,
                                                const std::filesystem::path& dir, const std::string& stem,
                                                const std::string& libs = "", bool* built = nullptr);

// A loaded shared object: its symbols stay valid while it lives.
class SharedObject {
 public:
  static Result<std::shared_ptr<SharedObject>> Open(const std::filesystem::path& so);
  ~SharedObject();
  Result<void*> Symbol(const std::string& name) const;

 private:
  SharedObject() = default;
  std::filesystem::path path_;
  void* handle_ = nullptr;
};

}  // namespace graphfuse
