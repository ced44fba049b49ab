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

// Profiling counters of kernels that run GEMMs inside a larger kernel (a GEMM with its
// epilogue, attention): thread-time spent inside the GEMM calls and in the kernel's tasks in
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
