// The acceptance ratios, measured interleaved.
//
// On a shared 2-vCPU VM the memory bandwidth drifts by up to 2x within minutes, so a ratio of
// two benchmark rows measured a minute apart says little. Here every comparison (A, B) is
// timed as alternating samples A, B, A, B, ... (each sample: enough back-to-back calls to last
// at least 2 ms at >= 1 Mi elements, 0.2 ms below; 3 warm-up calls first), and the ratio
// reported is the median of the per-sample-pair ratios, beside median(A) and median(B).
//
//   1. Add, Mul, Bias, Scale, Silu at 16 Mi f32 through RunOp vs STREAM triad, as % of triad
//      bandwidth (bytes = the op's minimum traffic; triad 12 B/element)
//   2. Gelu through RunOp vs the hand-written AVX-512 + libmvec GELU, time ratio (16 Mi, 1 Mi, 64 Ki)
//   3. dispatch: ThreadPool::Run(2, empty task); RunOp(Add) on 64 and 4096 elements forced to
//      2 threads and to 1 thread
//   4. the public call path: RunOp(Add) on 4096 elements with a default CpuContext vs the
//      hand-written add on 1 thread
//
// All on one ThreadPool of 2 threads, CpuContext max_threads 2 unless said. Every output is
// checked element by element against a scalar float64 formula before timing; a mismatch
// aborts the run. Output: a markdown report on stdout; --json FILE writes the same numbers
// (and the raw per-call sample times).
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpu/tile_program.h"
#include "graphfuse/cpu.h"
#include "graphfuse/ops.h"
#include "graphfuse/tensor.h"
#include "graphfuse/thread_pool.h"
#include "hand_loops.h"

#ifndef GF_BENCH_SOURCE_DIR
#define GF_BENCH_SOURCE_DIR "."
#endif

namespace gf = graphfuse;
namespace gfb = graphfuse::bench;

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kBig = int64_t{1} << 24;   // 16 Mi
constexpr int64_t kBiasWidth = 4096;         // Bias runs on [n / 4096, 4096] with a [4096] bias
constexpr float kTriadScalar = 3.f;
constexpr float kScaleAlpha = 1.5f;          // not 1: a multiply by 1 could be special-cased
constexpr uint32_t kSeed = 20240611;
constexpr int kWarmupCalls = 3;

// ---------------------------------------------------------------------------------------------
// Machine, date, commit.

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  size_t b = 0;
  while (b < s.size() && s[b] == ' ') ++b;
  return s.substr(b);
}

std::string Shell(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (size_t k = std::fread(buf, 1, sizeof buf, p)) out.append(buf, k);
    pclose(p);
  }
  return Trim(out);
}

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return Trim(line.substr(line.find(':') + 1));
  return "unknown";
}

std::string UtcNow() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

struct RunInfo {
  std::string cpu, kernel, date, commit, dirty;
  long nproc = 0;
};

// [[maybe_unused]] below: a helper of main's AVX-512 part only (the hand-written loops it
// compares against need AVX-512; elsewhere main stops early and these go unused).
[[maybe_unused]] RunInfo CollectInfo() {
  RunInfo r;
  r.cpu = CpuModel();
  r.nproc = sysconf(_SC_NPROCESSORS_ONLN);
  utsname u{};
  if (uname(&u) == 0) r.kernel = std::string(u.sysname) + " " + u.release;
  r.date = UtcNow();
  const std::string git = std::string("git -C '") + GF_BENCH_SOURCE_DIR + "' ";
  r.commit = Shell(git + "rev-parse --short HEAD 2>/dev/null");
  if (r.commit.empty()) r.commit = "unknown";
  // Tracked files that differ from the commit: the binary may not be the commit's code.
  std::istringstream st(Shell(git + "diff --name-only HEAD 2>/dev/null"));
  for (std::string line; std::getline(st, line);)
    if (!line.empty()) r.dirty += (r.dirty.empty() ? "" : " ") + line;
  return r;
}

// ---------------------------------------------------------------------------------------------
// Interference: CPU time that other processes and the hypervisor (steal) took while a
// comparison ran, from /proc/stat and /proc/self/stat (clock ticks, usually 10 ms).

struct CpuTimes {
  double busy_s = 0;   // all CPUs: user + nice + system + irq + softirq
  double steal_s = 0;  // all CPUs: time the hypervisor ran something else
  double self_s = 0;   // this process, all threads: utime + stime
  Clock::time_point at;
};

CpuTimes ReadCpuTimes() {
  CpuTimes c;
  c.at = Clock::now();
  const double tick = 1.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
  std::ifstream st("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (st >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) {
    c.busy_s = (user + nice + system + irq + softirq) * tick;
    c.steal_s = steal * tick;
  }
  std::ifstream self("/proc/self/stat");
  std::string line;
  std::getline(self, line);
  const size_t paren = line.rfind(')');
  if (paren != std::string::npos) {
    std::istringstream rest(line.substr(paren + 2));  // fields from 3 (state) on
    std::string f;
    double utime = 0, stime = 0;
    for (int field = 3; rest >> f; ++field) {
      if (field == 14) utime = std::atof(f.c_str());
      if (field == 15) {
        stime = std::atof(f.c_str());
        break;
      }
    }
    c.self_s = (utime + stime) * tick;
  }
  return c;
}

struct Interference {
  double wall_s = 0, others_s = 0, steal_s = 0;
  // As a share of all CPUs' time over the interval.
  double OthersShare(long nproc) const { return wall_s > 0 ? others_s / (wall_s * static_cast<double>(nproc)) : 0; }
  double StealShare(long nproc) const { return wall_s > 0 ? steal_s / (wall_s * static_cast<double>(nproc)) : 0; }
};

Interference Between(const CpuTimes& a, const CpuTimes& b) {
  Interference i;
  i.wall_s = std::chrono::duration<double>(b.at - a.at).count();
  i.others_s = std::max(0.0, (b.busy_s - a.busy_s) - (b.self_s - a.self_s));
  i.steal_s = b.steal_s - a.steal_s;
  return i;
}

// Co-tenants: a comparison during which other processes took more than max_others of all
// CPUs is measured again (a 2-thread launch waits for its worker to be scheduled: one busy
// co-tenant turns a 0.5 us dispatch into milliseconds). Before each attempt, wait (within the
// run's wait budget) for a quiet half second.
struct QuietGuard {
  double max_others = 0.10;
  int retries = 5;
  double wait_budget_s = 600;
  double waited_s = 0;
  long nproc = 1;

  void WaitQuiet() {
    while (waited_s < wait_budget_s) {
      const CpuTimes a = ReadCpuTimes();
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      const Interference l = Between(a, ReadCpuTimes());
      waited_s += l.wall_s;
      if (l.OthersShare(nproc) <= max_others) return;
    }
  }

  // Runs measure() until one attempt is quiet enough or the retries are spent; returns the
  // last attempt's interference and how many attempts it took.
  template <class Measure>
  std::pair<Interference, int> Run(const std::string& what, Measure measure) {
    for (int attempt = 1;; ++attempt) {
      WaitQuiet();
      const CpuTimes before = ReadCpuTimes();
      measure();
      const Interference load = Between(before, ReadCpuTimes());
      if (load.OthersShare(nproc) <= max_others || attempt > retries) return {load, attempt};
      std::fprintf(stderr, "bench_ratios: %s: other processes took %.0f%% of the CPUs, measuring again\n",
                   what.c_str(), 100 * load.OthersShare(nproc));
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Data: per size, two f32 inputs uniform in [-3, 3] (|v| >= 1e-3), a [4096] bias, an output.

struct Buffers {
  int64_t n = 0;
  gf::Tensor x, y, bias, out;
};

using gf::bench::FillUniform;
gf::Tensor Alloc(int64_t n) { return gf::bench::Alloc(gf::DType::kF32, n); }

class Data {
 public:
  Buffers& For(int64_t n) {
    auto& slot = buffers_[n];
    if (!slot) {
      slot = std::make_unique<Buffers>();
      Buffers& b = *slot;
      b.n = n;
      std::mt19937 rng(kSeed ^ static_cast<uint32_t>(n));
      b.x = Alloc(n);
      b.y = Alloc(n);
      b.bias = Alloc(kBiasWidth);
      b.out = Alloc(n);
      FillUniform(b.x, rng);
      FillUniform(b.y, rng);
      FillUniform(b.bias, rng);
      std::memset(b.out.data(), 0, b.out.nbytes());  // first-touch page faults now, not timed
    }
    return *slot;
  }

 private:
  std::map<int64_t, std::unique_ptr<Buffers>> buffers_;
};

// ---------------------------------------------------------------------------------------------
// Correctness: the whole output against a scalar float64 formula.

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "bench_ratios: WRONG RESULT, not timing it: %s\n", what.c_str());
  std::fflush(stderr);
  std::exit(2);
}

void Poison(Buffers& b) { std::memset(b.out.data(), 0xFF, b.out.nbytes()); }  // NaN everywhere

// out[i] must be Near(ref(i)) for every i.
template <class Ref>
void CheckAll(const std::string& what, const Buffers& b, Ref ref) {
  const float* out = b.out.data_as<float>();
  for (int64_t i = 0; i < b.n; ++i) {
    const double want = ref(i);
    if (!gfb::Near(out[i], want)) {
      char msg[256];
      std::snprintf(msg, sizeof msg, "%s, n=%lld: element %lld is %.9g, the scalar reference gives %.9g",
                    what.c_str(), static_cast<long long>(b.n), static_cast<long long>(i), out[i], want);
      Fail(msg);
    }
  }
}

// The float64 formula of each op timed here (as written in include/graphfuse/ops.def).
std::function<double(int64_t)> Reference(gf::OpKind kind, const Buffers& b) {
  const float* x = b.x.data_as<float>();
  const float* y = b.y.data_as<float>();
  const float* bias = b.bias.data_as<float>();
  switch (kind) {
    case gf::OpKind::kAdd:
      return [=](int64_t i) { return double{x[i]} + y[i]; };
    case gf::OpKind::kMul:
      return [=](int64_t i) { return double{x[i]} * y[i]; };
    case gf::OpKind::kBias:
      return [=](int64_t i) { return double{x[i]} + bias[i % kBiasWidth]; };
    case gf::OpKind::kScale:
      return [=](int64_t i) { return double{x[i]} * kScaleAlpha; };
    case gf::OpKind::kSilu:
      return [=](int64_t i) { return x[i] / (1.0 + std::exp(-double{x[i]})); };
    case gf::OpKind::kGelu:
      return [=](int64_t i) { return 0.5 * x[i] * std::erfc(-double{x[i]} / std::sqrt(2.0)); };
    default:
      Fail(std::string("no scalar reference for ") + gf::OpName(kind));
  }
}

// ---------------------------------------------------------------------------------------------
// Callables: one RunOp launch / one hand-written loop, each checked once when made.

gf::TensorView View(const gf::Tensor& t, gf::Shape shape) {
  return gf::TensorView{t.dtype(), std::move(shape), const_cast<void*>(t.data())};
}

struct OpCall {
  gf::OpKind kind;
  std::vector<gf::TensorView> ins;
  gf::TensorView out;
  gf::OpAttrs attrs;
  gf::CpuContext ctx;
  int64_t bytes = 0;  // minimum traffic: inputs read once, output written once

  void operator()() const {
    const gf::Status s = gf::RunOp(kind, std::span<const gf::TensorView>(ins), out, attrs, ctx);
    if (!s.ok()) Fail(s.ToString());
  }
  // The threads this launch runs on, as the library decides them (capped by the tile count).
  int Threads() const {
    const int64_t n = out.numel();
    const int64_t tiles = (n + gf::cpu::kTileElements - 1) / gf::cpu::kTileElements;
    const int cost = std::max(gf::GetOpInfo(kind).cost, 1);
    return static_cast<int>(std::min<int64_t>(ctx.ThreadsFor(n * cost), tiles));
  }
};

std::string CtxName(const gf::CpuContext& c) {
  char buf[96];
  if (c.min_work_per_thread == gf::kDefaultMinWorkPerThread)
    std::snprintf(buf, sizeof buf, "max_threads %d", c.max_threads);
  else
    std::snprintf(buf, sizeof buf, "max_threads %d, min_work %lld", c.max_threads,
                  static_cast<long long>(c.min_work_per_thread));
  return buf;
}

[[maybe_unused]] OpCall MakeOp(gf::OpKind kind, Buffers& b, gf::CpuContext ctx) {
  OpCall c{kind, {}, b.out.view(), gf::DefaultAttrs(kind), ctx};
  const int64_t n = b.n;
  switch (kind) {
    case gf::OpKind::kAdd:
    case gf::OpKind::kMul:
      c.ins = {b.x.view(), b.y.view()};
      break;
    case gf::OpKind::kBias: {
      const gf::Shape s{n / kBiasWidth, kBiasWidth};
      c.ins = {View(b.x, s), b.bias.view()};
      c.out = View(b.out, s);
      break;
    }
    case gf::OpKind::kScale:
      c.attrs.alpha = kScaleAlpha;
      c.ins = {b.x.view()};
      break;
    default:
      c.ins = {b.x.view()};
      break;
  }
  c.bytes = c.out.numel() * 4;
  for (const gf::TensorView& t : c.ins) c.bytes += t.numel() * 4;
  Poison(b);
  c();
  CheckAll(std::string("RunOp(") + gf::OpName(kind) + ", " + CtxName(ctx) + ")", b, Reference(kind, b));
  return c;
}

// ---------------------------------------------------------------------------------------------
// Interleaved timing.

struct Runner {
  std::string name;
  std::function<void(int64_t)> batch;  // `calls` back-to-back calls
  int64_t calls = 1;
  std::vector<double> t;  // seconds per call, one per sample
};

template <class F>
Runner Make(std::string name, F f) {
  Runner r;
  r.name = std::move(name);
  r.batch = [f](int64_t calls) {
    for (int64_t i = 0; i < calls; ++i) f();
  };
  return r;
}

double TimeBatch(Runner& r, int64_t calls) {
  const auto t0 = Clock::now();
  r.batch(calls);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Warm-up calls, then the calls per sample: the fastest of 3 batches sets the per-call time,
// and a sample gets 1.3x the calls that would just reach min_sample_s at that speed.
void Calibrate(Runner& r, double min_sample_s) {
  r.batch(kWarmupCalls);
  int64_t calls = 1;
  double dt = TimeBatch(r, calls);
  while (dt < min_sample_s / 4 && calls < (int64_t{1} << 26)) {
    calls *= dt > 0 ? std::clamp<int64_t>(static_cast<int64_t>(min_sample_s / 4 / dt * 1.2), 2, 100) : 100;
    dt = TimeBatch(r, calls);
  }
  double per_call = dt / static_cast<double>(calls);
  for (int k = 0; k < 2; ++k) per_call = std::min(per_call, TimeBatch(r, calls) / static_cast<double>(calls));
  r.calls = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(1.3 * min_sample_s / per_call)));
}

// Round-robin samples: r0, r1, ..., r0, r1, ...
[[maybe_unused]] void Interleave(std::vector<Runner*> rs, double min_sample_s, int samples) {
  for (Runner* r : rs) Calibrate(*r, min_sample_s);
  for (Runner* r : rs) r->t.assign(samples, 0.0);
  for (int s = 0; s < samples; ++s)
    for (Runner* r : rs) r->t[s] = TimeBatch(*r, r->calls) / static_cast<double>(r->calls);
}

double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}
double Median(const std::vector<double>& v) { return Quantile(v, 0.5); }

[[maybe_unused]] double MinSampleFor(int64_t n) { return n >= (int64_t{1} << 20) ? 2e-3 : 2e-4; }

// ---------------------------------------------------------------------------------------------
// Results.

enum class Goal { kNone, kAtLeast, kAtMost };

struct PairRow {
  std::string section, name, a_name, b_name, ratio_name;
  int64_t n = 0;
  double a_bytes = 0, b_bytes = 0;  // per call; 0: no bandwidth column
  std::vector<double> ta, tb, ratio;
  int64_t calls_a = 0, calls_b = 0;
  Goal goal = Goal::kNone;
  double target = 0;
  bool percent = false;  // ratio printed as a percentage
  Interference load;     // of the attempt reported
  int attempts = 1;
  double a_target_s = 0;  // > 0: A's own time target (at most)

  bool Met() const {
    const double m = Median(ratio);
    return goal == Goal::kAtLeast ? m >= target : m <= target;
  }
};

struct SingleRow {
  std::string name, note;
  Interference load;  // of the whole interleaved group (the attempt reported)
  int attempts = 1;
  std::vector<double> t;
  int64_t calls = 0;
  Goal goal = Goal::kNone;
  double target_s = 0;
};

[[maybe_unused]] std::string SizeName(int64_t n) {
  if (n >= (int64_t{1} << 20) && n % (int64_t{1} << 20) == 0) return std::to_string(n >> 20) + " Mi";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + " Ki";
  return std::to_string(n);
}

std::string Fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// A per-call time with a unit that keeps 3-4 significant digits.
std::string Time(double s) {
  if (s >= 1e-3) return Fmt("%.3f ms", s * 1e3);
  if (s >= 1e-6) return Fmt("%.3f us", s * 1e6);
  return Fmt("%.1f ns", s * 1e9);
}

[[maybe_unused]] std::string TimeCell(double s, double bytes) {
  std::string c = Time(s);
  if (bytes > 0) c += " (" + Fmt("%.2f", bytes / s / 1e9) + " GB/s)";
  return c;
}

[[maybe_unused]] std::string RatioText(const PairRow& r, double v) { return r.percent ? Fmt("%.1f%%", 100 * v) : Fmt("%.3f", v); }

[[maybe_unused]] std::string TargetText(const PairRow& r) {
  if (r.goal == Goal::kNone) return "-";
  const std::string t = r.percent ? Fmt("%.0f%%", 100 * r.target) : Fmt("%.2f", r.target);
  return (r.goal == Goal::kAtLeast ? ">= " : "<= ") + t;
}

std::string JsonString(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (static_cast<unsigned char>(c) < 0x20) o += Fmt("\\u%04x", c);
    else o += c;
  }
  return o + "\"";
}

std::string JsonArray(const std::vector<double>& v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) o += (i ? ", " : "") + Fmt("%.6g", v[i]);
  return o + "]";
}

std::string JsonNumber(double v) { return std::isfinite(v) ? Fmt("%.10g", v) : "null"; }

std::string JsonLoad(const Interference& l) {
  return "{\"wall_s\": " + JsonNumber(l.wall_s) + ", \"others_cpu_s\": " + JsonNumber(l.others_s) +
         ", \"steal_s\": " + JsonNumber(l.steal_s) + "}";
}

const char* GoalJson(Goal g) { return g == Goal::kAtLeast ? "\">=\"" : g == Goal::kAtMost ? "\"<=\"" : "null"; }

[[maybe_unused]] void WriteJson(const std::string& path, const RunInfo& info, int samples, const std::vector<PairRow>& pairs,
               const std::vector<SingleRow>& singles, const std::vector<double>& launch_diff, double seconds,
               const Interference& total, const QuietGuard& guard) {
  std::ofstream f(path);
  if (!f) Fail("cannot write " + path);
  f << "{\n  \"machine\": {\"cpu\": " << JsonString(info.cpu) << ", \"nproc\": " << info.nproc
    << ", \"kernel\": " << JsonString(info.kernel) << "},\n";
  f << "  \"date_utc\": " << JsonString(info.date) << ",\n  \"commit\": " << JsonString(info.commit)
    << ",\n  \"uncommitted_tracked_files\": " << JsonString(info.dirty) << ",\n";
  f << "  \"samples\": " << samples << ", \"warmup_calls\": " << kWarmupCalls
    << ", \"min_sample_s\": {\"n >= 1Mi\": 0.002, \"n < 1Mi\": 0.0002}, \"run_seconds\": " << JsonNumber(seconds)
    << ",\n  \"interference\": " << JsonLoad(total) << ",\n  \"quiet_guard\": {\"max_others\": "
    << JsonNumber(guard.max_others) << ", \"retries\": " << guard.retries << ", \"wait_budget_s\": "
    << JsonNumber(guard.wait_budget_s) << ", \"waited_s\": " << JsonNumber(guard.waited_s) << "},\n";
  f << "  \"pairs\": [\n";
  for (size_t i = 0; i < pairs.size(); ++i) {
    const PairRow& r = pairs[i];
    const double ma = Median(r.ta), mb = Median(r.tb);
    f << "    {\"section\": " << JsonString(r.section) << ", \"name\": " << JsonString(r.name)
      << ", \"n\": " << r.n << ",\n     \"a\": " << JsonString(r.a_name) << ", \"b\": " << JsonString(r.b_name)
      << ",\n     \"median_a_s\": " << JsonNumber(ma) << ", \"median_b_s\": " << JsonNumber(mb);
    if (r.a_bytes > 0)
      f << ", \"bytes_a\": " << JsonNumber(r.a_bytes) << ", \"bytes_b\": " << JsonNumber(r.b_bytes)
        << ", \"gbps_a\": " << JsonNumber(r.a_bytes / ma / 1e9) << ", \"gbps_b\": " << JsonNumber(r.b_bytes / mb / 1e9);
    f << ",\n     \"ratio\": " << JsonString(r.ratio_name) << ", \"ratio_median\": " << JsonNumber(Median(r.ratio))
      << ", \"ratio_p25\": " << JsonNumber(Quantile(r.ratio, 0.25))
      << ", \"ratio_p75\": " << JsonNumber(Quantile(r.ratio, 0.75)) << ", \"target_op\": " << GoalJson(r.goal)
      << ", \"target\": " << (r.goal == Goal::kNone ? "null" : JsonNumber(r.target))
      << ", \"met\": " << (r.goal == Goal::kNone ? "null" : r.Met() ? "true" : "false");
    if (r.a_target_s > 0)
      f << ", \"a_target_s\": " << JsonNumber(r.a_target_s)
        << ", \"a_met\": " << (ma <= r.a_target_s ? "true" : "false");
    f << ",\n     \"interference\": " << JsonLoad(r.load) << ", \"attempts\": " << r.attempts
      << ",\n     \"calls_per_sample_a\": " << r.calls_a << ", \"calls_per_sample_b\": " << r.calls_b
      << ",\n     \"samples_a_s\": " << JsonArray(r.ta) << ",\n     \"samples_b_s\": " << JsonArray(r.tb)
      << ",\n     \"ratios\": " << JsonArray(r.ratio) << "}" << (i + 1 < pairs.size() ? "," : "") << "\n";
  }
  f << "  ],\n  \"dispatch\": [\n";
  for (size_t i = 0; i < singles.size(); ++i) {
    const SingleRow& r = singles[i];
    f << "    {\"name\": " << JsonString(r.name) << ", \"note\": " << JsonString(r.note)
      << ", \"median_s\": " << JsonNumber(Median(r.t)) << ", \"p25_s\": " << JsonNumber(Quantile(r.t, 0.25))
      << ", \"p75_s\": " << JsonNumber(Quantile(r.t, 0.75)) << ", \"target_op\": " << GoalJson(r.goal)
      << ", \"target_s\": " << (r.goal == Goal::kNone ? "null" : JsonNumber(r.target_s))
      << ", \"met\": " << (r.goal == Goal::kNone ? "null" : Median(r.t) <= r.target_s ? "true" : "false")
      << ", \"calls_per_sample\": " << r.calls << ",\n     \"interference_of_group\": " << JsonLoad(r.load)
      << ", \"attempts\": " << r.attempts
      << ",\n     \"samples_s\": " << JsonArray(r.t) << "}"
      << (i + 1 < singles.size() ? "," : "") << "\n";
  }
  f << "  ],\n  \"add_4096_two_thread_launch_minus_one_thread\": {\"median_s\": " << JsonNumber(Median(launch_diff))
    << ", \"p25_s\": " << JsonNumber(Quantile(launch_diff, 0.25))
    << ", \"p75_s\": " << JsonNumber(Quantile(launch_diff, 0.75)) << ", \"samples_s\": " << JsonArray(launch_diff)
    << "}\n}\n";
  if (!f) Fail("error writing " + path);
}

// ---------------------------------------------------------------------------------------------

void Usage() {
  std::fprintf(stderr,
               "usage: bench_ratios [--json FILE] [--samples N] [--max-others F] [--retries N] [--wait S]\n"
               "  --json FILE      also write the numbers (and raw samples) as JSON\n"
               "  --samples N      samples per side of each comparison (default 31)\n"
               "  --max-others F   measure a comparison again when other processes took more than this\n"
               "                   share of all CPUs meanwhile (default 0.10; 1 = never)\n"
               "  --retries N      at most this many measurements again per comparison (default 5)\n"
               "  --wait S         seconds the whole run may wait for quiet CPUs before attempts (default 600)\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int samples = 31;
  QuietGuard guard;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--samples" && i + 1 < argc) {
      samples = std::atoi(argv[++i]);
      if (samples < 3) return Usage(), 1;
    } else if (a == "--max-others" && i + 1 < argc) {
      guard.max_others = std::atof(argv[++i]);
    } else if (a == "--retries" && i + 1 < argc) {
      guard.retries = std::max(0, std::atoi(argv[++i]));
    } else if (a == "--wait" && i + 1 < argc) {
      guard.wait_budget_s = std::atof(argv[++i]);
    } else {
      Usage();
      return a == "--help" || a == "-h" ? 0 : 1;
    }
  }
#ifndef __AVX512F__
  std::fprintf(stderr, "bench_ratios: built without AVX-512; the hand-written loops it compares against need it\n");
  return 1;
#else
  const auto start = Clock::now();
  const CpuTimes cpu_start = ReadCpuTimes();
  const RunInfo info = CollectInfo();
  guard.nproc = info.nproc;
  std::printf("# bench_ratios\n\n");
  std::printf("- machine: %s, nproc %ld, %s\n", info.cpu.c_str(), info.nproc, info.kernel.c_str());
  std::printf("- date: %s\n", info.date.c_str());
  std::printf("- commit: %s%s%s\n", info.commit.c_str(),
              info.dirty.empty() ? "" : ", tracked files differing from it: ", info.dirty.c_str());
  std::printf("- method: interleaved samples A,B,A,B,... (%d each, %d warm-up calls); a sample is enough "
              "back-to-back calls to last >= 2 ms (n >= 1 Mi) or >= 0.2 ms (smaller n); times are per call; "
              "ratio = median of the %d per-pair ratios (p25-p75 beside it)\n",
              samples, kWarmupCalls, samples);
  std::printf("- f32 data uniform in [-3, 3]; one ThreadPool of 2 threads; every output checked against a "
              "scalar float64 formula before timing\n");
  std::printf("- others / steal: CPU time other processes / the hypervisor took while a comparison ran, as a "
              "share of all %ld CPUs (10 ms ticks: coarse for short rows); a comparison with others above %.0f%% "
              "is measured again (at most %d times, after waiting for a quiet 0.5 s; tries counted in the column)\n\n",
              info.nproc, 100 * guard.max_others, guard.retries);
  std::fflush(stdout);

  gf::ThreadPool pool(2);
  Data data;
  std::vector<PairRow> pairs;
  const gf::CpuContext two{&pool, 2};

  // Times A and B interleaved and fills a row; ratio(ta, tb) per sample pair.
  auto run_pair = [&](PairRow row, Runner a, Runner b, auto ratio) {
    std::tie(row.load, row.attempts) =
        guard.Run(row.name, [&] { Interleave({&a, &b}, MinSampleFor(row.n), samples); });
    row.ta = a.t;
    row.tb = b.t;
    row.calls_a = a.calls;
    row.calls_b = b.calls;
    for (int s = 0; s < samples; ++s) row.ratio.push_back(ratio(a.t[s], b.t[s]));
    std::fprintf(stderr, "bench_ratios: %-50s %s\n", row.name.c_str(), RatioText(row, Median(row.ratio)).c_str());
    pairs.push_back(std::move(row));
  };

  // 1. Bandwidth-bound ops at 16 Mi vs STREAM triad, as % of triad bandwidth.
  {
    Buffers& b = data.For(kBig);
    const float* x = b.x.data_as<float>();
    const float* y = b.y.data_as<float>();
    float* out = b.out.data_as<float>();
    const double triad_bytes = 12.0 * kBig;
    auto triad = [&pool, x, y, out] { gfb::StreamTriad(pool, x, y, kTriadScalar, out, kBig, 2); };
    Poison(b);
    triad();
    CheckAll("triad", b, [&](int64_t i) { return x[i] + double{kTriadScalar} * y[i]; });

    struct Case {
      gf::OpKind kind;
      double target;
    };
    for (const Case& c : {Case{gf::OpKind::kAdd, 0.85}, Case{gf::OpKind::kMul, 0.85}, Case{gf::OpKind::kBias, 0.85},
                          Case{gf::OpKind::kScale, 0.85}, Case{gf::OpKind::kSilu, 0.75}}) {
      const OpCall op = MakeOp(c.kind, b, two);
      PairRow row;
      row.section = "1. % of STREAM triad, 16 Mi f32, 2 threads";
      row.name = std::string(gf::OpName(c.kind)) + " / triad";
      row.n = kBig;
      row.a_name = std::string("RunOp(") + gf::OpName(c.kind) + ")";
      row.b_name = "triad a=b+s*c";
      row.ratio_name = "op GB/s / triad GB/s";
      row.a_bytes = static_cast<double>(op.bytes);
      row.b_bytes = triad_bytes;
      row.goal = Goal::kAtLeast;
      row.target = c.target;
      row.percent = true;
      const double ab = row.a_bytes;
      run_pair(row, Make(row.a_name, op), Make("triad", triad),
               [=](double ta, double tb) { return (ab / ta) / (triad_bytes / tb); });
    }

    // Context for the targets above, not targets themselves: what plain loops reach.
    struct Ctx {
      const char* name;
      double bytes;
      std::function<void()> f;
      std::function<double(int64_t)> ref;
    };
    const Ctx ctxs[] = {
        {"hand AVX-512 add", 12.0 * kBig, [&pool, x, y, out] { gfb::HandAdd(pool, x, y, out, kBig, 2); },
         [=](int64_t i) { return double{x[i]} + y[i]; }},
        {"hand AVX-512 silu (libmvec expf)", 8.0 * kBig, [&pool, x, out] { gfb::HandSilu(pool, x, out, kBig, 2); },
         [=](int64_t i) { return x[i] / (1.0 + std::exp(-double{x[i]})); }},
        {"STREAM copy", 8.0 * kBig, [&pool, x, out] { gfb::StreamCopy(pool, x, out, kBig, 2); },
         [=](int64_t i) { return double{x[i]}; }},
    };
    for (const Ctx& c : ctxs) {
      Poison(b);
      c.f();
      CheckAll(c.name, b, c.ref);
      PairRow row;
      row.section = "1. % of STREAM triad, 16 Mi f32, 2 threads";
      row.name = std::string(c.name) + " / triad (context)";
      row.n = kBig;
      row.a_name = c.name;
      row.b_name = "triad a=b+s*c";
      row.ratio_name = "GB/s / triad GB/s";
      row.a_bytes = c.bytes;
      row.b_bytes = triad_bytes;
      row.percent = true;
      const double ab = c.bytes;
      auto f = c.f;
      run_pair(row, Make(c.name, [f] { f(); }), Make("triad", triad),
               [=](double ta, double tb) { return (ab / ta) / (triad_bytes / tb); });
    }
  }

  // 2. Gelu through RunOp vs the hand-written libmvec GELU, time ratio.
  for (int64_t n : {kBig, int64_t{1} << 20, int64_t{1} << 16}) {
    Buffers& b = data.For(n);
    const float* x = b.x.data_as<float>();
    float* out = b.out.data_as<float>();
    auto hand = [&pool, x, out, n] { gfb::HandGelu(pool, x, out, n, 2); };
    Poison(b);
    hand();
    CheckAll("hand GELU", b, Reference(gf::OpKind::kGelu, b));
    const OpCall op = MakeOp(gf::OpKind::kGelu, b, two);
    PairRow row;
    row.section = "2. Gelu, RunOp / hand-written libmvec loop, 2 threads";
    row.name = "Gelu " + SizeName(n);
    row.n = n;
    row.a_name = "RunOp(Gelu)";
    row.b_name = "hand AVX-512 GELU (libmvec erff)";
    row.ratio_name = "time RunOp / time hand";
    row.a_bytes = 8.0 * static_cast<double>(n);
    row.b_bytes = row.a_bytes;
    if (n == kBig) {
      row.goal = Goal::kAtMost;
      row.target = 1.25;
    }
    run_pair(row, Make(row.a_name, op), Make("hand", hand), [](double ta, double tb) { return ta / tb; });
  }

  // 3. Dispatch, all rows interleaved with each other.
  std::vector<SingleRow> singles;
  std::vector<double> launch_diff;
  {
    Buffers& b64 = data.For(64);
    Buffers& b4k = data.For(4096);
    const OpCall add64_2 = MakeOp(gf::OpKind::kAdd, b64, gf::CpuContext{&pool, 2, 1});
    const OpCall add64_1 = MakeOp(gf::OpKind::kAdd, b64, gf::CpuContext{&pool, 1});
    const OpCall add4k_2 = MakeOp(gf::OpKind::kAdd, b4k, gf::CpuContext{&pool, 2, 1});
    const OpCall add4k_1 = MakeOp(gf::OpKind::kAdd, b4k, gf::CpuContext{&pool, 1});
    auto threads_note = [](const OpCall& c) {
      return "runs on " + std::to_string(c.Threads()) + " thread(s) as the library computes it (tiles of " +
             std::to_string(gf::cpu::kTileElements) + " elements)";
    };
    std::vector<Runner> rs;
    rs.push_back(Make("pool.Run(2, empty task)", [&pool] { pool.Run(2, [](void*, int, int) {}, nullptr); }));
    rs.push_back(Make("pool.Run(1, empty task)", [&pool] { pool.Run(1, [](void*, int, int) {}, nullptr); }));
    rs.push_back(Make("RunOp(Add) 64 el., CpuContext{&pool, 2, min_work 1}", add64_2));
    rs.push_back(Make("RunOp(Add) 64 el., CpuContext{&pool, 1}", add64_1));
    rs.push_back(Make("RunOp(Add) 4096 el., CpuContext{&pool, 2, min_work 1}", add4k_2));
    rs.push_back(Make("RunOp(Add) 4096 el., CpuContext{&pool, 1}", add4k_1));
    std::vector<Runner*> ptrs;
    for (Runner& r : rs) ptrs.push_back(&r);
    const auto [load, attempts] = guard.Run("dispatch", [&] { Interleave(ptrs, 2e-4, samples); });
    const std::string notes[] = {"one 2-thread dispatch of an empty task", "inline call, no dispatch",
                                 threads_note(add64_2), threads_note(add64_1), threads_note(add4k_2),
                                 threads_note(add4k_1)};
    for (size_t i = 0; i < rs.size(); ++i) {
      SingleRow row{rs[i].name, notes[i], load, attempts, rs[i].t, rs[i].calls};
      if (i == 0) {
        row.goal = Goal::kAtMost;
        row.target_s = 2e-6;
      }
      singles.push_back(std::move(row));
    }
    for (int s = 0; s < samples; ++s) launch_diff.push_back(rs[4].t[s] - rs[5].t[s]);
  }

  // 4. The public call path on a small tensor vs the hand-written add on 1 thread.
  {
    Buffers& b = data.For(4096);
    const float* x = b.x.data_as<float>();
    const float* y = b.y.data_as<float>();
    float* out = b.out.data_as<float>();
    auto hand = [&pool, x, y, out] { gfb::HandAdd(pool, x, y, out, 4096, 1); };
    Poison(b);
    hand();
    CheckAll("hand add", b, Reference(gf::OpKind::kAdd, b));
    const OpCall op = MakeOp(gf::OpKind::kAdd, b, gf::CpuContext{&pool});
    PairRow row;
    row.section = "4. public call path, Add 4096 f32";
    row.name = "Add 4096, default CpuContext / hand 1 thread";
    row.n = 4096;
    row.a_name = "RunOp(Add), CpuContext{&pool} (" + std::to_string(op.Threads()) + " thread)";
    row.b_name = "hand AVX-512 add, 1 thread";
    row.ratio_name = "time RunOp / time hand";
    row.a_target_s = 0.5e-6;
    run_pair(row, Make(row.a_name, op), Make("hand", hand), [](double ta, double tb) { return ta / tb; });
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const Interference total = Between(cpu_start, ReadCpuTimes());
  auto load_text = [&](const Interference& l, int attempts = 1) {
    std::string t =
        Fmt("%.0f%%", 100 * l.OthersShare(info.nproc)) + " / " + Fmt("%.0f%%", 100 * l.StealShare(info.nproc));
    if (attempts > 1) t += " (" + std::to_string(attempts) + " tries)";
    if (l.OthersShare(info.nproc) > guard.max_others) t += " **disturbed**";
    return t;
  };

  // ---- report, in section order (the dispatch rows before section 4)
  auto print_dispatch = [&] {
    std::printf("\n## 3. dispatch (all rows interleaved with each other)\n\n");
    std::printf("others / steal over these rows: %s\n\n",
                singles.empty() ? "-" : load_text(singles[0].load, singles[0].attempts).c_str());
    std::printf("| row | median | p25 - p75 | note | target | met |\n|---|---:|---:|---|---|---|\n");
    for (const SingleRow& r : singles) {
      const double m = Median(r.t);
      std::printf("| %s | %s | %s - %s | %s | %s | %s |\n", r.name.c_str(), Time(m).c_str(),
                  Time(Quantile(r.t, 0.25)).c_str(), Time(Quantile(r.t, 0.75)).c_str(), r.note.c_str(),
                  r.goal == Goal::kNone ? "-" : ("<= " + Time(r.target_s)).c_str(),
                  r.goal == Goal::kNone ? "-" : m <= r.target_s ? "yes" : "**no**");
    }
    std::printf("| Add 4096: 2-thread launch minus 1-thread, per sample pair | %s | %s - %s | | - | - |\n",
                Time(Median(launch_diff)).c_str(), Time(Quantile(launch_diff, 0.25)).c_str(),
                Time(Quantile(launch_diff, 0.75)).c_str());
  };
  std::string section;
  for (const PairRow& r : pairs) {
    if (r.section != section) {
      if (r.section.rfind("4.", 0) == 0) print_dispatch();
      section = r.section;
      std::printf("\n## %s\n\n", section.c_str());
      std::printf("| comparison | A | B | median A | median B | ratio (median of pairs) | p25 - p75 | target | met "
                  "| others / steal |\n");
      std::printf("|---|---|---|---:|---:|---:|---:|---|---|---:|\n");
    }
    const double ma = Median(r.ta), mb = Median(r.tb);
    std::printf("| %s | %s | %s | %s | %s | %s | %s - %s | %s | %s | %s |\n", r.name.c_str(), r.a_name.c_str(),
                r.b_name.c_str(), TimeCell(ma, r.a_bytes).c_str(), TimeCell(mb, r.b_bytes).c_str(),
                RatioText(r, Median(r.ratio)).c_str(), RatioText(r, Quantile(r.ratio, 0.25)).c_str(),
                RatioText(r, Quantile(r.ratio, 0.75)).c_str(), TargetText(r).c_str(),
                r.goal == Goal::kNone ? "-" : r.Met() ? "yes" : "**no**", load_text(r.load, r.attempts).c_str());
    // A target on A's own time (the public path): a row of its own.
    if (r.a_target_s > 0)
      std::printf("| time of A | %s | | %s | | | %s - %s | <= %s | %s | |\n", r.a_name.c_str(), Time(ma).c_str(),
                  Time(Quantile(r.ta, 0.25)).c_str(), Time(Quantile(r.ta, 0.75)).c_str(), Time(r.a_target_s).c_str(),
                  ma <= r.a_target_s ? "yes" : "**no**");
  }
  std::printf("\n(run took %.1f s, of which %.1f s checking or waiting for quiet CPUs; others / steal over the "
              "whole run: %s / %s)\n",
              seconds, guard.waited_s, Fmt("%.0f%%", 100 * total.OthersShare(info.nproc)).c_str(),
              Fmt("%.0f%%", 100 * total.StealShare(info.nproc)).c_str());

  if (!json_path.empty()) WriteJson(json_path, info, samples, pairs, singles, launch_diff, seconds, total, guard);
  return 0;
#endif
}
