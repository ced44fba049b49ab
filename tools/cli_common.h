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
#include "graphfuse/thread_pool.h"

namespace graphfuse::cli {

// Exit codes of the command-line contract (docs/ARCHITECTURE.md, "The command-line contract").
inline constexpr int kExitOk = 0, kExitMismatch = 1, kExitBadInput = 2;

// --cpu-codegen: what the code generator did, for the command's report: "2 compiled (3.4 s),
// 1 from the cache, 1 left to the tile executor (1 with integer or bool data)", and any
// failure with its message.
std::string CodegenSummary(const CpuCodegen& cg);
// --cpu-codegen: creates the code generator (an error names the flag) and points ctx at it;
// the caller keeps the returned object alive as long as ctx runs plans.
Result<std::unique_ptr<CpuCodegen>> AttachCodegen(CpuContext& ctx);

// Prints "graphfuse CMD: message" to stderr (a message that already begins with "CMD: ", as
// Args' errors do, is not prefixed twice) and returns kExitBadInput.
int FailUsage(const std::string& command, const Status& s);

// --backend cuda: Ok when GPU 0 can be used, else an error saying what is missing (no device,
// or a build without the CUDA toolkit). Call it before any long work.
Status CheckCudaBackend();

// --dtype: what a model computes in. On --backend cuda (with --emulate-gpu where there is no
// GPU) the model is converted to bf16 / f16; on the CPU, bf16 holds the GEMMs' constant weights
// in bf16 (TargetOptions::cpu_bf16_weights) and f16 is an error naming the command.
Status CheckDtypeBackend(const std::string& command, DType dtype, const std::string& backend);

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
