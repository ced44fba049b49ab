// Native code for elementwise programs on the CPU. The tile executor interprets a fused group
// one instruction at a time over an L1-resident tile: every instruction makes a pass over the
// tile. With a CpuCodegen in the CpuContext, a program whose operands are f32 and whose
// layout is at most two-dimensional (each operand contiguous along the last dim, or broadcast
// along it: a scalar, a [C] bias, a per-row value) becomes ONE loop over SIMD vectors, every
// intermediate in registers, compiled by the host C++ compiler from the op table's rows and
// loaded with dlopen. Results are bit-identical to the tile executor's: the loop evaluates
// the same row expressions with the same vector functions, and contracts no a*b+c.
//
// Compiling takes about 2 s per kernel. Kernels are cached in memory (per CpuCodegen) and on
// disk (by a hash of the source, the compiler and its flags), so a kernel is compiled once per
// machine. Programs outside that scope, and every program when no compiler works, keep
// running on the tile executor; stats() counts both.
//
//   auto cg = graphfuse::CpuCodegen::Create();           // checks the compiler and headers
//   graphfuse::CpuContext ctx{&pool};
//   ctx.codegen = cg->get();
//   plan->Run(inputs, outputs, ctx);
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "graphfuse/status.h"

namespace graphfuse {

class CpuCodegen {
 public:
  struct Options {
    // Where compiled kernels are kept. Empty: $GF_KERNEL_CACHE/cpu when that is set, else
    // $XDG_CACHE_HOME/graphfuse/cpu, else ~/.cache/graphfuse/cpu.
    std::string cache_dir{};
    // The compiler command. Empty: $CXX when set, else the compiler that built graphfuse.
    std::string compiler{};
    // The disk cache's size bound: when its kernels (gf_cpu_*.so) take more when a generator
    // is created, the least recently used are removed down to three quarters of it. A kernel
    // found in the cache counts as used. 0: no bound.
    int64_t cache_limit_bytes = int64_t{256} << 20;
  };
  struct Stats {
    int compiled = 0;         // kernels compiled by this object
    int loaded = 0;           // kernels found in the disk cache
    // Programs left to the tile executor (dtype, layout, aliasing), counted each time one is
    // planned: a plan step when its buffers move, a GEMM or norm epilogue on every launch.
    int outside_scope = 0;
    std::map<std::string, int> outside_why;  // ... by reason ("integer or bool data", ...)
    int pruned = 0;           // cached kernels removed at creation to respect cache_limit_bytes
    int failed = 0;           // programs whose compile failed, each tried once (the tile executor runs them)
    double compile_seconds = 0;
    std::string last_error;   // the last failure's message, with the compiler's log
  };

  // Checks that the compiler runs and the headers the generated code includes are present.
  static Result<std::unique_ptr<CpuCodegen>> Create(const Options& options);
  static Result<std::unique_ptr<CpuCodegen>> Create();  // default Options
  ~CpuCodegen();
  CpuCodegen(const CpuCodegen&) = delete;
  CpuCodegen& operator=(const CpuCodegen&) = delete;

  Stats stats() const;
  // What it did, for a report: "2 compiled (3.4 s), 1 from the cache, 1 left to the tile
  // executor (1 with integer or bool data)", and any failure with its message.
  std::string Summary() const;
  const std::string& cache_dir() const;

  struct Impl;  // src/cpu/cpu_codegen.cc
  Impl& impl() const { return *impl_; }

 private:
  explicit CpuCodegen(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace graphfuse
