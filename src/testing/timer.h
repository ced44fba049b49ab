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

namespace graphfuse {

// Times several variants INTERLEAVED: sample k of every variant is taken back to back, so a
// shared machine's drift (other tenants, DRAM bandwidth) hits all variants alike. Each sample
// batches calls to last at least `min_sample_s`. Returns per-variant medians and, per variant,
// the median of its per-round ratio to variant 0.
struct InterleavedTiming {
  std::vector<Timing> timings;
  std::vector<double> median_ratio_to_first;
};

template <class F>
InterleavedTiming MeasureInterleaved(std::vector<F>& fs, int samples = 21, double min_sample_s = 2e-4,
                                     int warmup = 3) {
  using Clock = std::chrono::steady_clock;
  const size_t n = fs.size();
  std::vector<int64_t> calls(n, 1);
  for (size_t v = 0; v < n; ++v) {
    for (int i = 0; i < warmup; ++i) fs[v]();
    for (;;) {
      const auto t0 = Clock::now();
      for (int64_t i = 0; i < calls[v]; ++i) fs[v]();
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      if (dt >= min_sample_s || calls[v] >= (int64_t{1} << 24)) break;
      calls[v] *= dt > 0 ? std::clamp<int64_t>(static_cast<int64_t>(min_sample_s / dt * 1.2), 2, 100) : 100;
    }
  }
  std::vector<std::vector<double>> t(n, std::vector<double>(samples));
  for (int s = 0; s < samples; ++s)
    for (size_t v = 0; v < n; ++v) {
      const auto t0 = Clock::now();
      for (int64_t i = 0; i < calls[v]; ++i) fs[v]();
      t[v][s] = std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(calls[v]);
    }
  InterleavedTiming out;
  for (size_t v = 0; v < n; ++v) {
    std::vector<double> ratios(samples);
    for (int s = 0; s < samples; ++s) ratios[s] = t[v][s] / t[0][s];
    std::sort(ratios.begin(), ratios.end());
    out.median_ratio_to_first.push_back(ratios[samples / 2]);
    std::vector<double> sorted = t[v];
    std::sort(sorted.begin(), sorted.end());
    out.timings.push_back(Timing{sorted[samples / 2], sorted.front(), samples, calls[v]});
  }
  return out;
}

}  // namespace graphfuse
