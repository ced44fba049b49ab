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
#include <random>
#include <sstream>

#include "core/cache_dir.h"
#include "core/hash.h"
#include "cpu/kernels/kernel_util.h"
#include "graphfuse/thread_pool.h"

namespace graphfuse::kernels {
namespace {

// The own kernels' revision: part of the machine key, so that a build whose own loops run at
// another speed does not take choices timed against the old ones. Raise it with such a change.
constexpr int kOwnKernelsRevision = 2;

// Timings closer than this are taken as equal (a shared machine's noise): the rule decides.
constexpr double kNoise = 0.05;

// With f32 weights and row counts that vary, oneDNN's copy of the weights would sit beside the
// own panels the decode rows need: the own loops, unmeasured.
constexpr const char* kOneFormWhy = "own loops: the model's row counts vary, and one packed copy serves them all";

const char* EngineName(GemmEngine e, int64_t rows, GemmWeightStorage storage) {
  const bool bf16 = storage == GemmWeightStorage::kBF16;
  if (e == GemmEngine::kOneDnn) return bf16 ? "oneDNN bf16 matmul" : "oneDNN matmul";
  if (bf16 && PackedGemm::OwnBf16Dot()) return "own bf16 dot-product tiles";
  return rows <= kGemmStreamRows ? "own stream" : "own tiles";
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

// One GEMM as a plan runs it: every block over the pool, A converted once where it is read in bf16.
void RunAll(const PackedGemm& g, const CpuContext& cpu, int64_t work, const float* a, float* c) {
  const int threads = static_cast<int>(std::min<int64_t>(cpu.ThreadsFor(work), g.blocks()));
  thread_local std::vector<uint16_t> a16_buf;
  const uint16_t* a16 = g.ConvertA(a, a16_buf);
  ForEachClaimed(cpu, threads, g.blocks(), [&](int64_t blk, int) { g.RunBlock(blk, a, c, {}, a16); });
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Times the candidates for one shape class: random weights packed by each engine, run in turns
// (so that a noisy stretch of the machine falls on both), the median of each.
GemmTuningCache::Entry Measure(int64_t rows, int64_t k, int64_t n, GemmWeightStorage storage, int threads) {
  std::mt19937 rng(static_cast<uint32_t>(k * 31 + n));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> b(static_cast<size_t>(k * n)), a(static_cast<size_t>(rows * k)), c(static_cast<size_t>(rows * n));
  for (float& x : b) x = u(rng);
  for (float& x : a) x = u(rng);
  GemmTuningCache::Entry e{.rows = rows, .k = k, .n = n, .storage = storage, .threads = threads};
  std::shared_ptr<const PackedGemm> own, dnn;
  PackedGemmOptions o{.storage = storage, .engine = GemmEngine::kOwn};
  if (auto made = PackedGemm::Create(rows, k, n, b.data(), n, n, {}, o); made.ok()) own = *made;
  o.engine = GemmEngine::kOneDnn;
  if (auto made = PackedGemm::Create(rows, k, n, b.data(), n, n, {}, o); made.ok()) dnn = *made;
  b = {};
  ThreadPool& pool = TimingPool(threads);
  const CpuContext cpu{&pool};
  const int64_t work = rows * n * k / 8;  // as RunPackedBlocks counts it
  std::vector<double> own_ms, dnn_ms;
  auto time = [&](const PackedGemm& g, std::vector<double>& into) {
    const auto t = std::chrono::steady_clock::now();
    RunAll(g, cpu, work, a.data(), c.data());
    into.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
  };
  // One warm-up each, then rounds: at least 3, at most 9, until 300 ms have passed.
  std::vector<double> warm;
  if (own) time(*own, warm);
  if (dnn) time(*dnn, warm);
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < 9; ++round) {
    if (round >= 3 && std::chrono::steady_clock::now() - start > std::chrono::milliseconds(300)) break;
    if (own) time(*own, own_ms);
    if (dnn) time(*dnn, dnn_ms);
  }
  e.own_ms = Median(own_ms);
  e.onednn_ms = Median(dnn_ms);
  // The rule's engine stays unless the other is faster by more than kNoise.
  const GemmEngine rule = PackedGemm::AutoEngine(rows, storage);
  if (!dnn || !own) e.engine = dnn ? GemmEngine::kOneDnn : GemmEngine::kOwn;
  else if (rule == GemmEngine::kOwn) e.engine = e.onednn_ms * (1 + kNoise) < e.own_ms ? GemmEngine::kOneDnn : GemmEngine::kOwn;
  else e.engine = e.own_ms * (1 + kNoise) < e.onednn_ms ? GemmEngine::kOwn : GemmEngine::kOneDnn;
  return e;
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

bool ParseEngine(const std::string& s, GemmEngine& out) {
  if (s == "own") out = GemmEngine::kOwn;
  else if (s == "onednn") out = GemmEngine::kOneDnn;
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
    std::string storage, engine;
    if (!(f >> e.rows >> e.k >> e.n >> storage >> e.threads >> engine >> e.own_ms >> e.onednn_ms) ||
        !ParseStorage(storage, e.storage) || !ParseEngine(engine, e.engine) || e.rows <= 0 || e.k <= 0 || e.n <= 0)
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
          << (x.engine == GemmEngine::kOneDnn ? "onednn" : "own") << ' ' << x.own_ms << ' ' << x.onednn_ms << "\n";
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

GemmChoice ChooseGemmEngine(int64_t m, int64_t k, int64_t n, GemmWeightStorage storage, bool one_form,
                            const GemmTuning& tuning) {
  GemmChoice c;
  c.rows = m;
  const char* why = nullptr;
  c.engine = PackedGemm::AutoEngine(m, storage, &why, one_form);
  c.why = why;
  const bool f32 = storage == GemmWeightStorage::kF32;
  if (!tuning.measure || k * n < kMinTunedWeights) {
    if (tuning.measure) c.why += " (the rule: weights under 1 MiB are not timed)";
    return c;
  }
  if (one_form && f32) {
    c.engine = GemmEngine::kOwn, c.why = kOneFormWhy;
    return c;
  }
  c.rows = TunedRows(m);
  c.threads = tuning.threads > 0 ? tuning.threads : static_cast<int>(std::max(1l, sysconf(_SC_NPROCESSORS_ONLN)));
  TuningState& s = State();
  GemmTuningCache::Entry e;
  {
    std::lock_guard lock(s.mu);
    const std::string dir = tuning.cache_dir.empty() ? UserCacheDir("gemm").string() : tuning.cache_dir;
    auto& file = s.files[dir];
    if (!file) file = std::make_unique<GemmTuningCache>(dir, GemmMachineKey());
    if (auto found = file->Find(c.rows, k, n, storage, c.threads)) {
      e = *found;
      c.from_cache = true;
      ++s.totals.from_cache;
    } else {
      // Timed under the lock: two plans compiled at once would time each other's noise.
      const auto t = std::chrono::steady_clock::now();
      e = Measure(c.rows, k, n, storage, c.threads);
      s.totals.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
      ++s.totals.timed;
      file->Put(e);
    }
  }
  c.measured = true;
  c.engine = e.engine;
  c.own_ms = e.own_ms;
  c.onednn_ms = e.onednn_ms;
  const char* name = EngineName(c.engine, m, storage);
  if (e.onednn_ms <= 0) {
    c.why = StrCat(name, ": oneDNN has no kernel for it here (own ", e.own_ms, " ms at ", c.rows, " rows)");
  } else {
    const double chosen = c.engine == GemmEngine::kOwn ? e.own_ms : e.onednn_ms;
    const double other = c.engine == GemmEngine::kOwn ? e.onednn_ms : e.own_ms;
    char how[160];
    if (other > chosen * (1 + kNoise))
      std::snprintf(how, sizeof how, "timed %.2fx faster than %s", other / chosen,
                    c.engine == GemmEngine::kOwn ? "oneDNN" : "the own loops");
    else
      std::snprintf(how, sizeof how, "timed within %.0f%% of %s, the rule's choice", kNoise * 100,
                    c.engine == GemmEngine::kOwn ? "oneDNN" : "the own loops");
    char times[96];
    std::snprintf(times, sizeof times, "own %.3g ms, oneDNN %.3g ms", e.own_ms, e.onednn_ms);
    c.why = StrCat(name, ": ", how, " at ", c.rows, " rows on ", c.threads, " threads (", times,
                   c.from_cache ? ", cached" : "", ")");
  }
  return c;
}

GemmTuningTotals GemmTuningSoFar() {
  TuningState& s = State();
  std::lock_guard lock(s.mu);
  return s.totals;
}

}  // namespace graphfuse::kernels
