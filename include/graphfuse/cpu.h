// Running elementwise ops on the CPU: one op = one kernel launch over the thread pool.
#pragma once

#include <atomic>
#include <span>

#include "graphfuse/ops.h"
#include "graphfuse/tensor.h"
#include "graphfuse/thread_pool.h"

namespace graphfuse {

// Below this much work (elements x op cost) a launch runs on the calling thread alone:
// a 2-thread dispatch costs ~1 us here, the time a 1-thread add spends on ~30K elements.
inline constexpr int64_t kDefaultMinWorkPerThread = 48 * 1024;

// GEMMs run through OpenBLAS, which picks its kernels from the CPU model when it is loaded.
// OpenBLAS 0.3.21 does not know newer Xeons (Sapphire Rapids, for one) and falls back to its
// SSE3 "Prescott" kernels: 4.3x slower than its AVX-512 ones on this project's machines. This
// returns the OPENBLAS_CORETYPE value that names the right kernels ("SkylakeX" with AVX-512,
// "Haswell" with AVX2) when that fallback happened and the variable is not set; else nullptr.
// The variable only takes effect in a process started with it (the `graphfuse` command
// re-executes itself once).
const char* SuggestedBlasCoreType();
// The kernels OpenBLAS runs in this process ("SkylakeX", "Prescott", ...).
const char* BlasCoreName();

// Settings that belong to the whole process. The library never changes them on its own (an
// embedding program may depend on them); a program applies them once, before any work, as the
// graphfuse command does with blas_threads = 1.
struct ProcessSettings {
  // OpenBLAS's own threads (openblas_set_num_threads). graphfuse splits every GEMM over its
  // thread pool, each task one sgemm: OpenBLAS threads on top of that compete with the pool for
  // the cores, so 1 is what graphfuse's kernels expect. 0: leave OpenBLAS as it is.
  int blas_threads = 0;
};
Status ApplyProcessSettings(const ProcessSettings& settings);
// OpenBLAS's thread count now.
int BlasThreads();

// Profiling counters of kernels that run BLAS inside a larger kernel (a GEMM with its
// epilogue, attention): thread-time spent inside the BLAS calls and in the kernel's tasks in
// all. A profiler reads blas_ns / task_ns after a kernel to split its time into GEMM work and
// the rest (the epilogue, softmax, RoPE), then resets both. Counted only when a CpuContext
// points here: no cost otherwise.
struct KernelCounters {
  std::atomic<int64_t> blas_ns{0};
  std::atomic<int64_t> task_ns{0};
};

class CpuCodegen;  // graphfuse/cpu_codegen.h

// Everything a CPU kernel needs from outside, passed explicitly (no globals).
struct CpuContext {
  ThreadPool* pool = nullptr;  // nullptr: run on the calling thread only
  int max_threads = 0;         // 0: all of the pool's threads
  int64_t min_work_per_thread = kDefaultMinWorkPerThread;
  KernelCounters* counters = nullptr;  // profiling (see KernelCounters); nullptr: off
  // Elementwise programs (fused groups, epilogues, single ops) compiled to native code that
  // keeps every intermediate in registers (graphfuse/cpu_codegen.h); nullptr: the tile
  // executor interprets them over L1 tiles.
  CpuCodegen* codegen = nullptr;

  // Threads for a launch of `work` units: 1 for small launches, then one per
  // min_work_per_thread, capped by the pool.
  int ThreadsFor(int64_t work) const;
};

// out = op(inputs...). Validates arity, dtypes, broadcast shapes, attributes and aliasing
// (out may be one of the inputs when that input has the output's shape and dtype), then runs
// the op as one launch. Errors name the op, dtypes and shapes.
Status RunOp(OpKind kind, std::span<const TensorView> inputs, const TensorView& out, const OpAttrs& attrs,
             const CpuContext& ctx);

// Same, allocating the output.
Result<Tensor> RunOp(OpKind kind, std::span<const TensorView> inputs, const OpAttrs& attrs,
                     const CpuContext& ctx);

}  // namespace graphfuse
