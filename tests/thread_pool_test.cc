#include "graphfuse/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace graphfuse {
namespace {

TEST(ThreadPool, RunsEveryThreadIdOnce) {
  ThreadPool pool(2);
  EXPECT_EQ(pool.num_threads(), 2);
  for (int round = 0; round < 2000; ++round) {
    std::atomic<int> mask{0}, count{0};
    pool.Parallel(2, [&](int tid, int n) {
      EXPECT_EQ(n, 2);
      mask |= 1 << tid;
      ++count;
    });
    ASSERT_EQ(mask.load(), 3);
    ASSERT_EQ(count.load(), 2);
  }
}

TEST(ThreadPool, ClampsAndRunsInlineForOne) {
  ThreadPool pool(2);
  const auto caller = std::this_thread::get_id();
  pool.Parallel(1, [&](int tid, int n) {
    EXPECT_EQ(tid, 0);
    EXPECT_EQ(n, 1);
    EXPECT_EQ(std::this_thread::get_id(), caller);
  });
  std::atomic<int> count{0};
  pool.Parallel(64, [&](int, int n) {
    EXPECT_EQ(n, 2);
    ++count;
  });
  EXPECT_EQ(count.load(), 2);
}

TEST(ThreadPool, WakesUpAfterSleeping) {
  ThreadPool pool(2, /*spin_us=*/10);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the worker is parked now
  std::atomic<int> count{0};
  pool.Parallel(2, [&](int, int) { ++count; });
  EXPECT_EQ(count.load(), 2);
}

TEST(ThreadPool, ScratchIsAlignedAndGrows) {
  ThreadPool pool(2);
  void* a = pool.Scratch(1, 100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  EXPECT_EQ(pool.Scratch(1, 100), a);  // reused
  void* b = pool.Scratch(1, 1 << 20);
  static_cast<char*>(b)[(1 << 20) - 1] = 1;
}

}  // namespace
}  // namespace graphfuse
