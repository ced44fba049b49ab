// Helpers shared by the non-elementwise kernels (src/cpu/kernels/*.cc): error prefixes, axis
// attributes and shape-like inputs read from the buffers, f32 row load/store for the float
// storage types, and splitting a launch over the thread pool. Internal to src/cpu/kernels/.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "graphfuse/cpu.h"
#include "graphfuse/dtype.h"
#include "graphfuse/graph.h"
#include "graphfuse/shape.h"
#include "graphfuse/status.h"
#include "graphfuse/tensor.h"
#include "graphfuse/thread_pool.h"
#include "cpu/kernel_registry.h"
#include "ir/schemas/infer_util.h"

namespace graphfuse::kernels {

using schemas::Product;
using schemas::TypeStr;

// "node 'mm1' (MatMul) with inputs f32[2,3], f32[3,4]": prefix for kernel errors.
inline std::string KernelWhere(const KernelContext& ctx) {
  std::string s = StrCat(ctx.node.Describe(), " with inputs ");
  for (size_t i = 0; i < ctx.inputs.size(); ++i)
    s += StrCat(i ? ", " : "", ctx.node.input(i) ? TypeStr(ctx.inputs[i]) : "<omitted>");
  return s;
}

// Runs body(item, tid) for every item in [0, n): on the calling thread when `threads` <= 1
// (tid 0), else on that many pool threads claiming one item at a time, so that a thread that
// starts late (or is descheduled) takes fewer items instead of stalling the launch.
template <class F>
void ForEachClaimed(const CpuContext& cpu, int threads, int64_t n, F&& body) {
  if (threads <= 1 || cpu.pool == nullptr) {
    for (int64_t i = 0; i < n; ++i) body(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  cpu.pool->Parallel(threads, [&](int tid, int) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) body(i, tid);
  });
}

// Whether optional input i was given (an omitted input has a null Value in the node; a given
// zero-size tensor may still have a null data pointer).
inline bool HasInput(const KernelContext& ctx, size_t i) { return i < ctx.inputs.size() && ctx.node.input(i); }

// A kernel's axis attribute normalized against `rank` (inference checked it already; nodes made
// by AddNodeTyped skip inference, so the kernel refuses rather than indexing out of bounds).
inline Result<int64_t> KernelAxis(const KernelContext& ctx, const char* key, int64_t def, int64_t rank) {
  const int64_t axis = ctx.node.GetInt(key, def);
  if (axis < -rank || axis >= rank)
    return InvalidArgument(KernelWhere(ctx), ": ", key, " ", axis, " is out of range for rank ", rank);
  return axis < 0 ? axis + rank : axis;
}

// The values of an i32/i64 tensor (kernels re-read their shape-like inputs from the buffers).
inline std::vector<int64_t> ReadInts(const TensorView& t) {
  const int64_t n = t.data ? t.numel() : 0;
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[i] = t.dtype == DType::kI32 ? t.as<const int32_t>()[i] : t.as<const int64_t>()[i];
  return out;
}

// Loads n elements of a float-typed buffer (f32/f16/bf16) starting at element `offset`, every
// `stride` elements, into dst as f32.
inline void LoadF32(DType t, const void* base, int64_t offset, int64_t stride, int64_t n, float* dst) {
  if (t == DType::kF32) {
    const float* p = static_cast<const float*>(base) + offset;
    if (stride == 1) std::memcpy(dst, p, static_cast<size_t>(n) * sizeof(float));
    else for (int64_t i = 0; i < n; ++i) dst[i] = p[i * stride];
    return;
  }
  const uint16_t* p = static_cast<const uint16_t*>(base) + offset;
  if (t == DType::kF16) for (int64_t i = 0; i < n; ++i) dst[i] = F16BitsToF32(p[i * stride]);
  else for (int64_t i = 0; i < n; ++i) dst[i] = BF16BitsToF32(p[i * stride]);
}

// Stores n f32 values into a float-typed buffer, rounding to nearest even for f16/bf16.
inline void StoreF32(DType t, void* base, int64_t offset, int64_t stride, int64_t n, const float* src) {
  if (t == DType::kF32) {
    float* p = static_cast<float*>(base) + offset;
    if (stride == 1) std::memmove(p, src, static_cast<size_t>(n) * sizeof(float));
    else for (int64_t i = 0; i < n; ++i) p[i * stride] = src[i];
    return;
  }
  uint16_t* p = static_cast<uint16_t*>(base) + offset;
  if (t == DType::kF16) for (int64_t i = 0; i < n; ++i) p[i * stride] = F32ToF16Bits(src[i]);
  else for (int64_t i = 0; i < n; ++i) p[i * stride] = F32ToBF16Bits(src[i]);
}

// Adds the steady-clock time from construction to destruction to *counter (when not null):
// KernelCounters accounting around a BLAS call or a whole task.
class ScopedNs {
 public:
  explicit ScopedNs(std::atomic<int64_t>* counter)
      : counter_(counter), t0_(counter ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{}) {}
  ~ScopedNs() {
    if (counter_)
      counter_->fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count(),
                          std::memory_order_relaxed);
  }
  ScopedNs(const ScopedNs&) = delete;
  ScopedNs& operator=(const ScopedNs&) = delete;

 private:
  std::atomic<int64_t>* counter_;
  std::chrono::steady_clock::time_point t0_;
};
inline std::atomic<int64_t>* BlasCounter(const CpuContext& c) { return c.counters ? &c.counters->blas_ns : nullptr; }
inline std::atomic<int64_t>* TaskCounter(const CpuContext& c) { return c.counters ? &c.counters->task_ns : nullptr; }

// Runs f(begin, end) over [0, items) split into contiguous chunks, one per thread; small
// launches (ctx.ThreadsFor(items * work_per_item) == 1) run on the calling thread.
template <class F>
void ParallelFor(const CpuContext& cpu, int64_t items, int64_t work_per_item, F&& f) {
  if (items <= 0) return;
  const int64_t work = work_per_item > 0 && items > INT64_MAX / work_per_item ? INT64_MAX : items * work_per_item;
  const int n = static_cast<int>(std::min<int64_t>(cpu.ThreadsFor(work), items));
  if (n <= 1 || cpu.pool == nullptr) {
    f(int64_t{0}, items);
    return;
  }
  cpu.pool->Parallel(n, [&](int tid, int nt) {
    const int64_t b = items * tid / nt, e = items * (tid + 1) / nt;
    if (b < e) f(b, e);
  });
}

}  // namespace graphfuse::kernels
