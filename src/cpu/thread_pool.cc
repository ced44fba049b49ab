#include "graphfuse/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <new>

#include "graphfuse/status.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GF_PAUSE() _mm_pause()
#else
#define GF_PAUSE() ((void)0)
#endif

namespace graphfuse {

ThreadPool::ThreadPool(int num_threads, int spin_us) : spin_us_(spin_us) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  num_threads = std::min(num_threads, 255);
  slots_.resize(num_threads);
  for (int t = 1; t < num_threads; ++t) workers_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  stop_ = true;
  generation_.fetch_add(256, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::WorkerLoop(int tid) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    if (g == seen) {
      // Spin (cheap wake-up for back-to-back launches), then sleep.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
      int k = 0;
      while ((g = generation_.load(std::memory_order_acquire)) == seen) {
        GF_PAUSE();
        if ((++k & 255) == 0 && std::chrono::steady_clock::now() > deadline) {
          generation_.wait(seen, std::memory_order_acquire);
        }
      }
    }
    seen = g;
    if (stop_) return;
    RunClaimedTasks(g >> 8, static_cast<int>(g & 0xFF));
  }
}

// Tasks are claimed, not assigned: the caller and every awake worker take the next task id
// until none is left. A worker the hypervisor is slow to wake (milliseconds here after it
// went to sleep) therefore never holds up a launch: the caller runs its share instead.
// The claim word carries the job's sequence number, so a late worker cannot claim a task of
// a job that is over, and it reads fn_/ctx_ only after a successful claim (the caller does
// not rewrite them until every task of the job is done).
void ThreadPool::RunClaimedTasks(uint64_t seq, int n) {
  const uint64_t tag = seq & 0xFFFFFFFFu;
  for (;;) {
    uint64_t c = claim_.load(std::memory_order_acquire);
    do {
      if ((c >> 32) != tag || static_cast<int>(c & 0xFFFFFFFFu) >= n) return;
    } while (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire));
    fn_(ctx_, static_cast<int>(c & 0xFFFFFFFFu), n);
    done_.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::Run(int n, Task fn, void* ctx) {
  n = std::clamp(n, 1, num_threads());
  if (n == 1) {
    fn(ctx, 0, 1);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  done_.store(0, std::memory_order_relaxed);
  const uint64_t seq = (generation_.load(std::memory_order_relaxed) >> 8) + 1;
  claim_.store((seq & 0xFFFFFFFFu) << 32, std::memory_order_release);
  generation_.store(seq << 8 | static_cast<uint64_t>(n), std::memory_order_release);
  generation_.notify_all();
  RunClaimedTasks(seq, n);
  while (done_.load(std::memory_order_acquire) != n) GF_PAUSE();
}

void* ThreadPool::Scratch(int tid, size_t bytes) {
  GF_CHECK(tid >= 0 && tid < num_threads(), "scratch for thread ", tid);
  Slot& s = slots_[tid];
  if (s.scratch_bytes < bytes) {
    bytes = (bytes + 4095) / 4096 * 4096;
    char* p = static_cast<char*>(std::aligned_alloc(64, bytes));
    GF_CHECK(p != nullptr, "scratch allocation of ", bytes, " bytes");
    s.scratch = std::unique_ptr<char[], void (*)(char*)>(p, [](char* q) { std::free(q); });
    s.scratch_bytes = bytes;
  }
  return s.scratch.get();
}

}  // namespace graphfuse
