// Small shared pieces of the `graphfuse` command: flag parsing with clear errors.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graphfuse/cpu.h"
#include "graphfuse/cpu_codegen.h"
#include "graphfuse/dtype.h"
#include "graphfuse/status.h"
#include "graphfuse/target.h"
#include "graphfuse/thread_pool.h"

namespace graphfuse::cli {

// Exit codes of the command-line contract (docs/ARCHITECTURE.md, "The command-line contract").
inline constexpr int kExitOk = 0, kExitMismatch = 1, kExitBadInput = 2;

// --cpu-codegen: creates the code generator (an error names the flag) and points ctx at it;
// the caller keeps the returned object alive as long as ctx runs plans.
Result<std::unique_ptr<CpuCodegen>> AttachCodegen(CpuContext& ctx);

// Prints "graphfuse CMD: message" to stderr (a message that already begins with "CMD: ", as
// Args' errors do, is not prefixed twice) and returns kExitBadInput.
int FailUsage(const std::string& command, const Status& s);

// --backend NAME with the command's target options, made to compute in --dtype
// (Target::ForDtype): on the cuda target bf16 / f16 convert the model; on the CPU bf16 holds the
// GEMMs' constant weights in bf16 and f16 is refused. Errors say what is missing (no device, a
// build without that backend), which options belong to another target, or where the dtype
// runs. Call it before any long work.
Result<std::shared_ptr<const Target>> MakeCommandTarget(const std::string& backend, const TargetOptions& options,
                                                        DType dtype);

// Whether `t` is the reference target in some dtype (the CPU, with bf16 weights or not): its
// plans are the ones a command runs on the host and times kernel by kernel; any other target's
// are run beside the reference's and compared with them.
bool IsReferenceKind(const Target& t);

// The same-run bandwidth ceiling that demo and bench report beside the kernels: STREAM triad
// a = b + 0.5 * c over n floats, split over `threads` threads of the pool (12 bytes/element).
inline void StreamTriad(ThreadPool& pool, int threads, float* a, const float* b, const float* c, int64_t n) {
  pool.Parallel(threads, [&](int tid, int nt) {
    const int64_t lo = n * tid / nt, hi = n * (tid + 1) / nt;
    for (int64_t i = lo; i < hi; ++i) a[i] = b[i] + 0.5f * c[i];
  });
}

// Walks argv after the command name.
class Args {
 public:
  Args(std::string command, std::vector<std::string> args) : command_(std::move(command)), args_(std::move(args)) {}
  bool Done() const { return i_ >= args_.size(); }
  const std::string& Next() { return args_[i_++]; }
  // The value after flag `name`, or an error naming the flag.
  Result<std::string> Value(const std::string& name);
  // An integer value in [lo, hi].
  Result<int64_t> Int(const std::string& name, int64_t lo, int64_t hi);
  // A finite number in [lo, hi].
  Result<double> Float(const std::string& name, double lo, double hi);
  // A backend name: "cpu" or "cuda".
  Result<std::string> Backend(const std::string& name);
  // A compute dtype (--dtype): "f32", "bf16" or "f16".
  Result<DType> Dtype(const std::string& name);
  // The CPU's GEMM engine (--cpu-gemm): "auto", "rule", "own" or "onednn".
  Result<CpuGemmEngine> CpuGemm(const std::string& name);
  // A file the command will write when it ends (--json, --dot), checked now so that a long
  // run does not end in "cannot write": its directory exists and is writable, and the path is
  // not a directory nor an existing file without write permission. Nothing is created.
  Result<std::string> OutputFile(const std::string& name);
  const std::string& command() const { return command_; }

 private:
  std::string command_;
  std::vector<std::string> args_;
  size_t i_ = 0;
};

}  // namespace graphfuse::cli
