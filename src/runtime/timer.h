// Median-of-samples timing for demo and bench: warm up, batch calls so one sample lasts at
// least `min_sample_s`, take `samples` samples, report the median (and min) per call.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace graphfuse {

struct Timing {
  double median_s = 0;
  double min_s = 0;
  int samples = 0;
  int64_t calls_per_sample = 0;
};

template <class F>
Timing MeasureMedian(F&& f, int samples = 21, double min_sample_s = 2e-4, int warmup = 3) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < warmup; ++i) f();
  int64_t calls = 1;
  for (;;) {  // find a batch size that makes one sample long enough to time
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < calls; ++i) f();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (dt >= min_sample_s || calls >= (int64_t{1} << 24)) break;
    calls *= dt > 0 ? std::clamp<int64_t>(static_cast<int64_t>(min_sample_s / dt * 1.2), 2, 100) : 100;
  }
  std::vector<double> t(samples);
  for (double& s : t) {
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < calls; ++i) f();
    s = std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(calls);
  }
  std::sort(t.begin(), t.end());
  return Timing{t[t.size() / 2], t.front(), samples, calls};
}

}  // namespace graphfuse
