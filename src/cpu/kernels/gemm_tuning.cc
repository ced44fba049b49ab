#include "cpu/kernels/gemm_tuning.h"

#include <cpuid.h>
#include <hwy/highway.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "core/cache_dir.h"
#include "core/hash.h"
#include "core/progress.h"
#include "graphfuse/thread_pool.h"

namespace graphfuse::kernels {
namespace {

// The own kernels' revision: part of the machine key, so that a build whose own loops run at
// another speed does not take choices timed against the old ones. Raise it with such a change.
constexpr int kOwnKernelsRevision = 4;

// With f32 weights and row counts that vary, oneDNN's copy of the weights would sit beside the
// own panels the decode rows need: the own loops, untimed.
constexpr const char* kOneFormWhy = "own loops: the model's row counts vary, and one packed copy serves them all";

// The candidates, in the order an Entry holds their times.
enum class Candidate { kOwn, kWiden, kOneDnn };

double TimeOf(const GemmTuningCache::Entry& e, Candidate c) {
  return c == Candidate::kOwn ? e.own_ms : c == Candidate::kWiden ? e.widen_ms : e.onednn_ms;
}

const char* CandidateName(Candidate c, int64_t rows, GemmWeightStorage storage) {
  const bool bf16 = storage == GemmWeightStorage::kBF16;
  switch (c) {
    case Candidate::kOneDnn: return bf16 ? "oneDNN bf16 matmul" : "oneDNN matmul";
    case Candidate::kWiden:
      return rows <= kGemmStreamRows ? "own stream, bf16 weights widened to f32"
                                     : "own tiles, bf16 weights widened to f32";
    case Candidate::kOwn: break;
  }
  if (bf16 && PackedGemm::OwnBf16Dot()) return "own bf16 dot-product tiles";
  return rows <= kGemmStreamRows ? "own stream" : "own tiles";
}

// The rule's candidate for these rows (PackedGemm::AutoEngine).
Candidate RuleCandidate(int64_t rows, GemmWeightStorage storage) {
  return PackedGemm::AutoEngine(rows, storage) == GemmEngine::kOneDnn ? Candidate::kOneDnn : Candidate::kOwn;
}

// The fastest of `allowed` (those timed), unless the rule's candidate, when allowed, is within
// kGemmNoise of it.
Candidate Fastest(const GemmTuningCache::Entry& e, std::initializer_list<Candidate> allowed, Candidate rule) {
  Candidate best = rule;
  double best_ms = 0;
  for (Candidate c : allowed)
    if (const double ms = TimeOf(e, c); ms > 0 && (best_ms == 0 || ms < best_ms)) best = c, best_ms = ms;
  for (Candidate c : allowed)
    if (c == rule && TimeOf(e, rule) > 0 && TimeOf(e, rule) <= best_ms * (1 + kGemmNoise)) return rule;
  return best;
}

std::string CpuBrand() {
  unsigned regs[12] = {};
  unsigned max = __get_cpuid_max(0x80000000u, nullptr);
  if (max < 0x80000004u) return "unknown CPU";
  for (unsigned i = 0; i < 3; ++i) __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
  std::string s(reinterpret_cast<const char*>(regs), sizeof(regs));
  s = s.c_str();
  while (!s.empty() && s.back() == ' ') s.pop_back();
  while (!s.empty() && s.front() == ' ') s.erase(s.begin());
  return s;
}

std::string CpuSignature() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return "?";
  const unsigned family = ((eax >> 8) & 0xf) + ((eax >> 20) & 0xff);
  const unsigned model = ((eax >> 4) & 0xf) | (((eax >> 16) & 0xf) << 4);
  return StrCat("family ", family, " model ", model, " stepping ", eax & 0xf);
}

const char* StorageName(GemmWeightStorage s) { return s == GemmWeightStorage::kBF16 ? "bf16" : "f32"; }

// A pool of `threads` threads for the timings, made once per count.
ThreadPool& TimingPool(int threads) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  std::lock_guard lock(mu);
  auto& p = pools[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return *p;
}

// Three significant digits.
std::string Round3(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Times the candidates for one shape class: random weights packed by each, run in turns (so that
// a noisy stretch of the machine falls on all of them), the median of each.
GemmTuningCache::Entry Measure(int64_t rows, int64_t k, int64_t n, GemmWeightStorage storage, int threads) {
  // Values in [-1, 1) from a xorshift: the timing needs no better randomness, and the largest
  // classes (an output layer's 65 M weights) filled from mt19937 took longer than their timing.
  uint32_t state = static_cast<uint32_t>(k * 31 + n) | 1u;
  auto next = [&state] {
    state ^= state << 13, state ^= state >> 17, state ^= state << 5;
    return static_cast<float>(state >> 8) * (2.f / 16777216.f) - 1.f;
  };
  std::vector<float> b(static_cast<size_t>(k * n)), a(static_cast<size_t>(rows * k)), c(static_cast<size_t>(rows * n));
  for (float& x : b) x = next();
  for (float& x : a) x = next();
  const bool widen = storage == GemmWeightStorage::kBF16 && PackedGemm::OwnBf16Dot();
  std::shared_ptr<const PackedGemm> made[3];  // per Candidate
  const PackedGemmOptions options[3] = {{.storage = storage, .engine = GemmEngine::kOwn},
                                        {.storage = storage, .engine = GemmEngine::kOwn, .bf16_dot = false},
                                        {.storage = storage, .engine = GemmEngine::kOneDnn}};
  for (int i = 0; i < 3; ++i) {
    if (i == 1 && !widen) continue;
    // A candidate without a kernel here (oneDNN's bf16 matmul below AVX-512) is left out.
    if (auto g = PackedGemm::Create(rows, k, n, b.data(), n, n, {}, options[i]); g.ok()) made[i] = *g;
  }
  b = {};
  ThreadPool& pool = TimingPool(threads);
  const CpuContext cpu{&pool};
  const int64_t work = rows * n * k / 8;  // as the MatMul kernel counts it
  std::vector<double> ms[3];
  auto time = [&](int i) {
    if (!made[i]) return;
    const auto t = std::chrono::steady_clock::now();
    RunPackedBlocks(cpu, *made[i], work, a.data(), c.data());  // as a plan runs it
    ms[i].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
  };
  // One warm-up each, then rounds until 300 ms have passed: at least 3, at most 41 (a decode
  // GEMM of a millisecond gets the most, where a shared machine's noise weighs most).
  for (int i = 0; i < 3; ++i) time(i);
  for (auto& v : ms) v.clear();
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < 41; ++round) {
    if (round >= 3 && std::chrono::steady_clock::now() - start > std::chrono::milliseconds(300)) break;
    for (int i = 0; i < 3; ++i) time(i);
  }
  return {.rows = rows, .k = k, .n = n, .storage = storage, .threads = threads,
          .own_ms = Median(ms[0]), .widen_ms = Median(ms[1]), .onednn_ms = Median(ms[2])};
}

struct TuningState {
  std::mutex mu;
  std::map<std::string, std::unique_ptr<GemmTuningCache>> files;  // per directory
  GemmTuningTotals totals;
};
TuningState& State() {
  static TuningState s;
  return s;
}

bool ParseStorage(const std::string& s, GemmWeightStorage& out) {
  if (s == "f32") out = GemmWeightStorage::kF32;
  else if (s == "bf16") out = GemmWeightStorage::kBF16;
  else return false;
  return true;
}

bool SameClass(const GemmTuningCache::Entry& a, const GemmTuningCache::Entry& b) {
  return a.rows == b.rows && a.k == b.k && a.n == b.n && a.storage == b.storage && a.threads == b.threads;
}

}  // namespace

int64_t TunedRows(int64_t m) {
  int64_t r = 1;
  while (r < m && r < kMaxTunedRows) r *= 2;
  return r;
}

std::string GemmMachineKey() {
  static const std::string key = [] {
    const dnnl_version_t* v = dnnl_version();
    return StrCat(CpuBrand(), "; ", CpuSignature(), "; avx2 ", __builtin_cpu_supports("avx2") ? 1 : 0,
                  " avx512f ", __builtin_cpu_supports("avx512f") ? 1 : 0, " avx512_bf16 ",
                  PackedGemm::OwnBf16Dot() ? 1 : 0, " amx_bf16 ", CpuHasAmxBf16() ? 1 : 0, "; own loops ",
                  hwy::TargetName(HWY_TARGET), " revision ", kOwnKernelsRevision, "; oneDNN ", v->major, ".",
                  v->minor, ".", v->patch, " (", v->hash, ")");
  }();
  return key;
}

GemmTuningCache::GemmTuningCache(std::filesystem::path dir, std::string machine)
    : dir_(std::move(dir)), machine_(std::move(machine)) {
  file_ = dir_ / StrCat("gemm-", Hash8(machine_), ".tsv");
  Load();
}

void GemmTuningCache::Load() {
  entries_.clear();
  std::ifstream in(file_);
  std::string line;
  if (!in || !std::getline(in, line) || line != "# " + machine_) return;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    Entry e;
    std::string storage;
    if (!(f >> e.rows >> e.k >> e.n >> storage >> e.threads >> e.own_ms >> e.widen_ms >> e.onednn_ms) ||
        !ParseStorage(storage, e.storage) || e.rows <= 0 || e.k <= 0 || e.n <= 0)
      continue;
    std::erase_if(entries_, [&](const Entry& x) { return SameClass(x, e); });
    entries_.push_back(e);
  }
}

std::optional<GemmTuningCache::Entry> GemmTuningCache::Find(int64_t rows, int64_t k, int64_t n,
                                                            GemmWeightStorage storage, int threads) const {
  const Entry want{.rows = rows, .k = k, .n = n, .storage = storage, .threads = threads};
  for (const Entry& e : entries_)
    if (SameClass(e, want)) return e;
  return std::nullopt;
}

bool GemmTuningCache::Put(const Entry& e) {
  namespace fs = std::filesystem;
  Load();  // what other processes wrote since
  std::erase_if(entries_, [&](const Entry& x) { return SameClass(x, e); });
  entries_.push_back(e);
  if (entries_.size() > kMaxEntries) entries_.erase(entries_.begin(), entries_.end() - kMaxEntries);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  const fs::path tmp = file_.string() + StrCat(".", getpid(), ".tmp");
  {
    std::ofstream out(tmp);
    if (!out) return false;
    out << "# " << machine_ << "\n";
    for (const Entry& x : entries_)
      out << x.rows << ' ' << x.k << ' ' << x.n << ' ' << StorageName(x.storage) << ' ' << x.threads << ' '
          << x.own_ms << ' ' << x.widen_ms << ' ' << x.onednn_ms << "\n";
    if (!out) return false;
  }
  fs::rename(tmp, file_, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return false;
  }
  // At most kMaxFiles machines' files: the least recently written go.
  std::vector<std::pair<fs::file_time_type, fs::path>> files;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("gemm-", 0) == 0 && it->path().extension() == ".tsv") {
      std::error_code tec;
      const auto t = fs::last_write_time(it->path(), tec);
      if (!tec) files.emplace_back(t, it->path());
    }
  }
  std::sort(files.begin(), files.end());
  for (size_t i = 0; i + kMaxFiles < files.size(); ++i)
    if (files[i].second != file_) fs::remove(files[i].second, ec);
  return true;
}

namespace {

// The timings of one shape class: from the cache, else timed now (and cached).
GemmTuningCache::Entry Timings(int64_t rows, int64_t k, int64_t n, GemmWeightStorage storage, int threads,
                               const GemmTuning& tuning, bool* from_cache) {
  TuningState& s = State();
  std::lock_guard lock(s.mu);
  const std::string dir = tuning.cache_dir.empty() ? UserCacheDir("gemm").string() : tuning.cache_dir;
  auto& file = s.files[dir];
  if (!file) file = std::make_unique<GemmTuningCache>(dir, GemmMachineKey());
  if (auto found = file->Find(rows, k, n, storage, threads)) {
    *from_cache = true;
    return *found;
  }
  // Timed under the lock: two plans compiled at once would time each other's noise.
  ReportProgress(StrCat("timing the CPU's GEMM engines for ", k, "x", n,
                        storage == GemmWeightStorage::kBF16 ? " bf16" : " f32", " weights at ", rows, " rows on ",
                        threads, " thread(s) (once per machine: kept in ", dir, ")"));
  const auto t = std::chrono::steady_clock::now();
  GemmTuningCache::Entry e = Measure(rows, k, n, storage, threads);
  s.totals.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  ++s.totals.timed;
  file->Put(e);
  *from_cache = false;
  return e;
}

}  // namespace

GemmChoice ChooseGemmEngine(int64_t m, int64_t k, int64_t n, GemmWeightStorage storage, bool one_form,
                            const GemmTuning& tuning) {
  GemmChoice c;
  c.rows = m;
  const char* why = nullptr;
  c.engine = PackedGemm::AutoEngine(m, storage, &why, one_form);
  c.why = why;
  if (!tuning.measure || k * n < kMinTunedWeights) {
    if (tuning.measure) c.why += " (the rule: weights under 1 MiB are not timed)";
    return c;
  }
  const bool bf16 = storage == GemmWeightStorage::kBF16;
  if (one_form && !bf16) {
    c.engine = GemmEngine::kOwn, c.why = kOneFormWhy;
    return c;
  }
  c.rows = TunedRows(m);
  c.threads = tuning.threads > 0 ? tuning.threads : static_cast<int>(std::max(1l, sysconf(_SC_NPROCESSORS_ONLN)));
  const GemmTuningCache::Entry e = Timings(c.rows, k, n, storage, c.threads, tuning, &c.from_cache);
  c.measured = true;
  c.own_ms = e.own_ms, c.widen_ms = e.widen_ms, c.onednn_ms = e.onednn_ms;
  const Candidate rule = RuleCandidate(c.rows, storage);
  Candidate pick;
  std::string form_note;
  if (one_form && e.widen_ms > 0) {
    // The own form timed faster at kOneFormRows serves every row count: one copy of the panels.
    bool cached = false;
    const GemmTuningCache::Entry at = Timings(kOneFormRows, k, n, storage, c.threads, tuning, &cached);
    const Candidate form = Fastest(at, {Candidate::kOwn, Candidate::kWiden}, Candidate::kOwn);
    pick = Fastest(e, {form, Candidate::kOneDnn}, rule == Candidate::kOwn ? form : rule);
    if (pick != Candidate::kOneDnn)
      form_note = StrCat("; the own form timed at ", kOneFormRows, " rows, one packed copy for every row count");
  } else {
    pick = Fastest(e, {Candidate::kOwn, Candidate::kWiden, Candidate::kOneDnn}, rule);
  }
  c.engine = pick == Candidate::kOneDnn ? GemmEngine::kOneDnn : GemmEngine::kOwn;
  c.bf16_dot = pick != Candidate::kWiden;
  // How the timings compare: the chosen one against the fastest other.
  const double chosen = TimeOf(e, pick);
  Candidate other = pick;
  for (Candidate x : {Candidate::kOwn, Candidate::kWiden, Candidate::kOneDnn})
    if (x != pick && TimeOf(e, x) > 0 && (other == pick || TimeOf(e, x) < TimeOf(e, other))) other = x;
  char how[192];
  if (other == pick)
    std::snprintf(how, sizeof how, "the only candidate with a kernel here");
  else if (TimeOf(e, other) > chosen * (1 + kGemmNoise))
    std::snprintf(how, sizeof how, "timed %.2fx faster than the %s", TimeOf(e, other) / chosen,
                  CandidateName(other, c.rows, storage));
  else if (pick == rule)
    std::snprintf(how, sizeof how, "timed within %.0f%% of the %s, the rule's choice", kGemmNoise * 100,
                  CandidateName(other, c.rows, storage));
  else
    std::snprintf(how, sizeof how, "timed within %.0f%% of the %s", kGemmNoise * 100,
                  CandidateName(other, c.rows, storage));
  std::string times = StrCat("own ", Round3(e.own_ms), " ms");
  if (e.widen_ms > 0) times += StrCat(", widened ", Round3(e.widen_ms), " ms");
  times += e.onednn_ms > 0 ? StrCat(", oneDNN ", Round3(e.onednn_ms), " ms") : ", oneDNN: no kernel";
  c.why = StrCat(CandidateName(pick, m, storage), ": ", how, " at ", c.rows, " rows on ", c.threads, " threads (",
                 times, c.from_cache ? ", cached" : "", ")", form_note);
  return c;
}

GemmTuningTotals GemmTuningSoFar() {
  TuningState& s = State();
  std::lock_guard lock(s.mu);
  return s.totals;
}

}  // namespace graphfuse::kernels
