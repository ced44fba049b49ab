// Running elementwise ops on the CPU: one op = one kernel launch over the thread pool.
#pragma once

#include <span>

#include "graphfuse/ops.h"
#include "graphfuse/tensor.h"
#include "graphfuse/thread_pool.h"

namespace graphfuse {

// Below this much work (elements x op cost) a launch runs on the calling thread alone:
// a 2-thread dispatch costs ~1 us here, the time a 1-thread add spends on ~30K elements.
inline constexpr int64_t kDefaultMinWorkPerThread = 48 * 1024;

// Everything a CPU kernel needs from outside, passed explicitly (no globals).
struct CpuContext {
  ThreadPool* pool = nullptr;  // nullptr: run on the calling thread only
  int max_threads = 0;         // 0: all of the pool's threads
  int64_t min_work_per_thread = kDefaultMinWorkPerThread;

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
