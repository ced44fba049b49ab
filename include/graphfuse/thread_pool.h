// A fixed pool of worker threads for one-launch-per-kernel CPU execution.
//
// Why not OpenMP's runtime: a 2-thread parallel region of libgomp or of LLVM's libomp costs
// two to three times a dispatch of a pool whose workers spin on one atomic generation counter,
// and libgomp's up to milliseconds after its workers went to sleep (bench/RESULTS.md, "The op
// library": BM_DispatchEmpty against BM_OmpEmptyRegion). Workers spin for `spin_us` after each
// job, then sleep on a futex (std::atomic::wait), so an idle pool does not burn a core for long.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace graphfuse {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread: a pool of 2 starts 1 worker. 0 = hardware threads.
  explicit ThreadPool(int num_threads = 0, int spin_us = 2000);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(ctx, tid, n) for every task tid in [0, n), spread over up to n threads (the caller
  // takes part), and returns when all are done. Each task runs exactly once, on whichever
  // thread claims it first. n is clamped to [1, num_threads()]; n == 1 runs inline with no
  // dispatch at all.
  using Task = void (*)(void* ctx, int tid, int n);
  void Run(int n, Task fn, void* ctx);

  template <class F>
  void Parallel(int n, F&& f) {
    Run(n, [](void* c, int tid, int nt) { (*static_cast<F*>(c))(tid, nt); }, &f);
  }

  // Per-thread scratch memory, 64-byte aligned, at least `bytes`; valid until the next call
  // with a larger size by the same thread. Allocated once and reused: no page faults per run.
  void* Scratch(int tid, size_t bytes);

 private:
  void WorkerLoop(int tid);
  void RunClaimedTasks(uint64_t seq, int n);

  struct alignas(64) Slot {
    std::unique_ptr<char[], void (*)(char*)> scratch{nullptr, [](char*) {}};
    size_t scratch_bytes = 0;
  };
  std::vector<std::thread> workers_;
  std::vector<Slot> slots_;
  alignas(64) std::atomic<uint64_t> generation_{0};  // (job sequence << 8) | threads in the job
  alignas(64) std::atomic<uint64_t> claim_{0};  // (job sequence << 32) | next unclaimed task
  alignas(64) std::atomic<int> done_{0};        // tasks of the current job finished
  Task fn_ = nullptr;
  void* ctx_ = nullptr;
  int spin_us_;
  std::atomic<bool> stop_{false};
};

}  // namespace graphfuse
