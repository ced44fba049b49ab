// The GEMM engines chosen by timing (src/cpu/kernels/gemm_tuning.h): the cache file bounded and
// keyed by the machine, the choice timed once and then taken from the cache, and a plan's
// PackedGemm built with the engine the cache names, checked against float64.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "cpu/kernels/gemm_tuning.h"
#include "graphfuse/dtype.h"
#include "graphfuse/progress.h"
#include "graphfuse/status.h"

namespace graphfuse::kernels {
namespace {

namespace fs = std::filesystem;
using Entry = GemmTuningCache::Entry;

// A fresh directory per test (the process keeps one cache per directory).
fs::path FreshDir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / StrCat("graphfuse_gemm_tuning_", getpid(), "_", name);
  fs::remove_all(d);
  return d;
}

int64_t Lines(const fs::path& f) {
  std::ifstream in(f);
  int64_t n = 0;
  for (std::string l; std::getline(in, l);) ++n;
  return n;
}

TEST(GemmTuning, RowsRoundUpToAPowerOfTwoUpToTheMost) {
  EXPECT_EQ(TunedRows(1), 1);
  EXPECT_EQ(TunedRows(3), 4);
  EXPECT_EQ(TunedRows(8), 8);
  EXPECT_EQ(TunedRows(9), 16);
  EXPECT_EQ(TunedRows(500), 512);
  EXPECT_EQ(TunedRows(4096), kMaxTunedRows);
}

TEST(GemmTuning, TheMachineKeyNamesTheCpuAndTheLibraries) {
  const std::string key = GemmMachineKey();
  EXPECT_NE(key.find("family "), std::string::npos) << key;
  EXPECT_NE(key.find("oneDNN "), std::string::npos) << key;
  EXPECT_NE(key.find("own loops "), std::string::npos) << key;
  EXPECT_NE(key.find(CpuHasAmxBf16() ? "amx_bf16 1" : "amx_bf16 0"), std::string::npos) << key;
}

TEST(GemmTuning, TheCacheKeepsTheNewestEntriesOnly) {
  const fs::path dir = FreshDir("bounded");
  GemmTuningCache cache(dir, "machine A");
  const int64_t total = static_cast<int64_t>(GemmTuningCache::kMaxEntries) + 10;
  for (int64_t i = 0; i < total; ++i)
    ASSERT_TRUE(cache.Put({.rows = 1, .k = 64 + i, .n = 64, .threads = 2, .own_ms = 1}));
  EXPECT_EQ(cache.entries().size(), GemmTuningCache::kMaxEntries);
  EXPECT_EQ(Lines(cache.file()), static_cast<int64_t>(GemmTuningCache::kMaxEntries) + 1);  // and the header
  GemmTuningCache again(dir, "machine A");
  EXPECT_FALSE(again.Find(1, 64, 64, GemmWeightStorage::kF32, 2)) << "the oldest entry stays";
  EXPECT_TRUE(again.Find(1, 64 + total - 1, 64, GemmWeightStorage::kF32, 2)) << "the newest entry is lost";
  // Putting a class again replaces its entry.
  ASSERT_TRUE(again.Put({.rows = 1, .k = 64 + total - 1, .n = 64, .threads = 2, .own_ms = 3, .onednn_ms = 2}));
  EXPECT_EQ(again.entries().size(), GemmTuningCache::kMaxEntries);
  EXPECT_EQ(again.Find(1, 64 + total - 1, 64, GemmWeightStorage::kF32, 2)->onednn_ms, 2);
  fs::remove_all(dir);
}

TEST(GemmTuning, EachMachineHasItsOwnFileAndTheDirectoryIsBounded) {
  const fs::path dir = FreshDir("machines");
  GemmTuningCache a(dir, "machine A; oneDNN 2.6"), b(dir, "machine A; oneDNN 3.9");
  EXPECT_NE(a.file(), b.file());
  ASSERT_TRUE(a.Put({.rows = 32, .k = 4096, .n = 4096, .storage = GemmWeightStorage::kBF16, .threads = 2,
                     .own_ms = 2, .onednn_ms = 1}));
  EXPECT_TRUE(GemmTuningCache(dir, "machine A; oneDNN 2.6").Find(32, 4096, 4096, GemmWeightStorage::kBF16, 2));
  // Not for another library version, another storage, other rows or other threads.
  EXPECT_FALSE(GemmTuningCache(dir, "machine A; oneDNN 3.9").Find(32, 4096, 4096, GemmWeightStorage::kBF16, 2));
  EXPECT_FALSE(a.Find(32, 4096, 4096, GemmWeightStorage::kF32, 2));
  EXPECT_FALSE(a.Find(16, 4096, 4096, GemmWeightStorage::kBF16, 2));
  EXPECT_FALSE(a.Find(32, 4096, 4096, GemmWeightStorage::kBF16, 4));
  // A file whose header names another machine (a hash that collided, an old format) is ignored.
  fs::copy_file(a.file(), b.file(), fs::copy_options::overwrite_existing);
  EXPECT_FALSE(GemmTuningCache(dir, "machine A; oneDNN 3.9").Find(32, 4096, 4096, GemmWeightStorage::kBF16, 2));
  // At most kMaxFiles machines' files: the last one written stays.
  for (size_t i = 0; i < GemmTuningCache::kMaxFiles + 3; ++i)
    ASSERT_TRUE(GemmTuningCache(dir, StrCat("machine ", i)).Put({.rows = 1, .k = 8, .n = 8, .threads = 1}));
  GemmTuningCache last(dir, StrCat("machine ", GemmTuningCache::kMaxFiles + 2));
  size_t files = 0;
  for (const auto& f : fs::directory_iterator(dir)) files += f.path().extension() == ".tsv";
  EXPECT_EQ(files, GemmTuningCache::kMaxFiles);
  EXPECT_TRUE(fs::exists(last.file()));
  fs::remove_all(dir);
}

TEST(GemmTuning, TimedOnceThenTakenFromTheCache) {
  const fs::path dir = FreshDir("timed");
  const GemmTuning tuning{.measure = true, .threads = 2, .cache_dir = dir.string()};
  const int64_t k = 512, n = 512;
  const GemmTuningTotals before = GemmTuningSoFar();
  // A timing tells the progress sink (the command line prints it): the class and the cache.
  std::vector<std::string> progress;
  SetProgressSink([&](std::string_view line) { progress.emplace_back(line); });
  const GemmChoice first = ChooseGemmEngine(3, k, n, GemmWeightStorage::kF32, false, tuning);
  ASSERT_EQ(progress.size(), 1u);
  EXPECT_NE(progress[0].find("512x512 f32 weights at 4 rows on 2 thread(s)"), std::string::npos) << progress[0];
  EXPECT_NE(progress[0].find(dir.string()), std::string::npos) << progress[0];
  EXPECT_TRUE(first.measured);
  EXPECT_FALSE(first.from_cache);
  EXPECT_EQ(first.rows, 4);
  EXPECT_EQ(first.threads, 2);
  EXPECT_GT(first.own_ms, 0);
  EXPECT_GT(first.onednn_ms, 0);  // oneDNN has an f32 matmul on every CPU graphfuse builds for
  EXPECT_EQ(first.widen_ms, 0);   // a candidate for bf16 weights only
  // The faster engine, unless the two are within the noise margin, where the rule's stays.
  const GemmEngine rule = PackedGemm::AutoEngine(4, GemmWeightStorage::kF32);
  const double chosen = first.engine == GemmEngine::kOwn ? first.own_ms : first.onednn_ms;
  const double other = first.engine == GemmEngine::kOwn ? first.onednn_ms : first.own_ms;
  EXPECT_TRUE(chosen <= other || (first.engine == rule && chosen <= other * (1 + kGemmNoise))) << first.why;
  EXPECT_NE(first.why.find("timed"), std::string::npos) << first.why;
  const GemmTuningTotals after = GemmTuningSoFar();
  EXPECT_EQ(after.timed, before.timed + 1);
  EXPECT_GT(after.ms, before.ms);

  // Any m that rounds to the same rows takes the same entry, from the cache.
  const GemmChoice again = ChooseGemmEngine(4, k, n, GemmWeightStorage::kF32, false, tuning);
  EXPECT_TRUE(again.from_cache);
  EXPECT_EQ(again.engine, first.engine);
  EXPECT_EQ(again.own_ms, first.own_ms);
  EXPECT_EQ(GemmTuningSoFar().timed, after.timed);
  EXPECT_NE(again.why.find("cached"), std::string::npos) << again.why;
  EXPECT_TRUE(GemmTuningCache(dir, GemmMachineKey()).Find(4, k, n, GemmWeightStorage::kF32, 2));

  // Nothing timed: tuning off, weights under the threshold, or f32 weights of a model whose rows vary.
  const GemmChoice off = ChooseGemmEngine(3, k, n, GemmWeightStorage::kF32, false, {.measure = false, .threads = 0, .cache_dir = {}});
  EXPECT_FALSE(off.measured);
  EXPECT_EQ(off.engine, PackedGemm::AutoEngine(3, GemmWeightStorage::kF32));
  const GemmChoice small = ChooseGemmEngine(3, 64, 64, GemmWeightStorage::kF32, false, tuning);
  EXPECT_FALSE(small.measured);
  EXPECT_NE(small.why.find("not timed"), std::string::npos) << small.why;
  const GemmChoice varying = ChooseGemmEngine(128, k, n, GemmWeightStorage::kF32, true, tuning);
  EXPECT_FALSE(varying.measured);
  EXPECT_EQ(varying.engine, GemmEngine::kOwn);
  EXPECT_EQ(GemmTuningSoFar().timed, after.timed);
  EXPECT_EQ(progress.size(), 1u);  // nothing more was timed
  SetProgressSink({});
  fs::remove_all(dir);
}

// explain's line for a plan's GEMM: timed where the options ask (a target's default: the
// timings, then "cached"), the rule where they ask for it (a plan compiled without a target).
TEST(GemmTuning, ExplainSaysTimedOrTheRule) {
  const fs::path dir = FreshDir("explain");
  ASSERT_EQ(setenv("GF_KERNEL_CACHE", dir.c_str(), 1), 0);
  const std::string timed = DescribePackedGemm(16, 1024, 512, {.gemm_engine = CpuGemmEngine::kAuto, .threads = 2});
  const std::string cached = DescribePackedGemm(16, 1024, 512, {.gemm_engine = CpuGemmEngine::kAuto, .threads = 2});
  const std::string rule = DescribePackedGemm(16, 1024, 512, {.gemm_engine = CpuGemmEngine::kRule, .threads = 2});
  unsetenv("GF_KERNEL_CACHE");
  EXPECT_NE(timed.find(": timed "), std::string::npos) << timed;
  EXPECT_EQ(timed.find("cached"), std::string::npos) << timed;
  EXPECT_NE(cached.find("cached"), std::string::npos) << cached;
  EXPECT_TRUE(fs::exists(GemmTuningCache(dir / "gemm", GemmMachineKey()).file()));
  EXPECT_EQ(rule.find("timed"), std::string::npos) << rule;
  EXPECT_NE(rule.find("(the rule: --cpu-gemm rule)"), std::string::npos) << rule;
  fs::remove_all(dir);
}

// C = A @ B by a PackedGemm whose kAuto reads its engine from the cache: the candidate the cached
// timings make fastest is the one built (oneDNN, the own loops, and with bf16 weights where the
// own loops are dot products, those loops with the weights widened), and its result matches
// float64 (B as packed: rounded to bf16 where it is held so).
TEST(GemmTuning, TheCachedTimingsNameTheEngineAPlanBuilds) {
  struct Case {
    GemmWeightStorage storage;
    double own, widen, onednn;
    GemmEngine engine;
    bool reads_a16;  // dot products (or oneDNN's bf16 matmul) read A rounded to bf16
  };
  const bool dot = PackedGemm::OwnBf16Dot();
  std::vector<Case> cases = {{GemmWeightStorage::kF32, 1, 0, 10, GemmEngine::kOwn, false},
                             {GemmWeightStorage::kF32, 10, 0, 1, GemmEngine::kOneDnn, false},
                             {GemmWeightStorage::kBF16, 1, dot ? 10.0 : 0.0, 10, GemmEngine::kOwn, dot}};
  if (dot) cases.push_back({GemmWeightStorage::kBF16, 10, 1, 10, GemmEngine::kOwn, false});
  int seed = 3;
  for (const Case& t : cases) {
    SCOPED_TRACE(StrCat("own ", t.own, " widened ", t.widen, " oneDNN ", t.onednn,
                        t.storage == GemmWeightStorage::kBF16 ? " bf16" : " f32"));
    const fs::path dir = FreshDir(StrCat("names_", seed));
    const int64_t m = 24, k = 512, n = 520;
    ASSERT_TRUE(GemmTuningCache(dir, GemmMachineKey())
                    .Put({.rows = TunedRows(m), .k = k, .n = n, .storage = t.storage, .threads = 2, .own_ms = t.own,
                          .widen_ms = t.widen, .onednn_ms = t.onednn}));
    std::mt19937 rng(static_cast<uint32_t>(seed++));
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), c(static_cast<size_t>(m * n));
    for (float& x : a) x = u(rng);
    for (float& x : b) x = u(rng);
    PackedGemmOptions o{.storage = t.storage};
    o.tuning = {.measure = true, .threads = 2, .cache_dir = dir.string()};
    auto g = PackedGemm::Create(m, k, n, b.data(), n, n, {}, o);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ((*g)->engine(), t.engine);
    EXPECT_EQ((*g)->ReadsA16(), t.reads_a16);
    for (int64_t blk = 0; blk < (*g)->blocks(); ++blk) (*g)->RunBlock(blk, a.data(), c.data());
    const bool bf16 = t.storage == GemmWeightStorage::kBF16;
    auto round = [&](float v, bool to_bf16) { return to_bf16 ? BF16BitsToF32(F32ToBF16Bits(v)) : v; };
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double want = 0, mag = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const double x = round(a[static_cast<size_t>(i * k + kk)], t.reads_a16);
          const double w = round(b[static_cast<size_t>(kk * n + j)], bf16);
          want += x * w, mag += std::fabs(x * w);
        }
        ASSERT_NEAR(c[static_cast<size_t>(i * n + j)], want, k * 0x1p-24 * mag + 1e-6) << i << ", " << j;
      }
    fs::remove_all(dir);
  }
}

// A model whose rows vary keeps one packed form of its bf16 weights: the own form timed faster at
// kOneFormRows rows serves the decode rows too, whichever form would win there alone.
TEST(GemmTuning, OneFormTakesTheOwnFormTimedAtItsRows) {
  if (!PackedGemm::OwnBf16Dot()) GTEST_SKIP() << "one own form only: the build has no bf16 dot products";
  const fs::path dir = FreshDir("one_form");
  const int64_t k = 512, n = 1024;
  GemmTuningCache cache(dir, GemmMachineKey());
  // At 1 row the dot products win alone; at kOneFormRows the widened loops do.
  ASSERT_TRUE(cache.Put({.rows = 1, .k = k, .n = n, .storage = GemmWeightStorage::kBF16, .threads = 2, .own_ms = 1,
                         .widen_ms = 2, .onednn_ms = 5}));
  ASSERT_TRUE(cache.Put({.rows = kOneFormRows, .k = k, .n = n, .storage = GemmWeightStorage::kBF16, .threads = 2,
                         .own_ms = 9, .widen_ms = 3, .onednn_ms = 5}));
  const GemmTuning tuning{.measure = true, .threads = 2, .cache_dir = dir.string()};
  const GemmChoice alone = ChooseGemmEngine(1, k, n, GemmWeightStorage::kBF16, false, tuning);
  EXPECT_EQ(alone.engine, GemmEngine::kOwn);
  EXPECT_TRUE(alone.bf16_dot) << alone.why;
  const GemmChoice varying = ChooseGemmEngine(1, k, n, GemmWeightStorage::kBF16, true, tuning);
  EXPECT_EQ(varying.engine, GemmEngine::kOwn);
  EXPECT_FALSE(varying.bf16_dot) << varying.why;
  EXPECT_NE(varying.why.find("one packed copy"), std::string::npos) << varying.why;
  const GemmChoice prefill = ChooseGemmEngine(kOneFormRows, k, n, GemmWeightStorage::kBF16, true, tuning);
  EXPECT_FALSE(prefill.bf16_dot) << prefill.why;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace graphfuse::kernels
