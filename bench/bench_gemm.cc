// The CPU GEMM against constant weights (kernels::PackedGemm) on the LLaMA-7B block's shapes and
// output layer (beside a 1024-wide one; or GPT-2 / BERT's: --shapes gpt2), beside a same-run read of the same number of bytes (the weight
// stream's ceiling), in interleaved samples on graphfuse's thread pool: per shape and engine
// (graphfuse's own loops or oneDNN's matmul, f32 or bf16 weights), the median time of the GEMM
// (its blocks claimed by the pool's threads, as the kernels run them) and of the read, GB/s of
// the weights, the GEMM's share of the read bandwidth, GFLOP/s, a * on the engine a plan takes
// on this machine (timed, gemm_tuning.h: cached, or timed here first) and a r on the rule's
// (PackedGemm::AutoEngine). With bf16 weights the stream is half as long. Decode rows (M <= 8)
// are the memory-bound case the streaming loop serves; past them the FMAs count more. The read
// runs over memory allocated as the packed weights are (huge pages or not).
//
//   bench_gemm [--threads T] [--samples S] [--rows M,M,...] [--storage f32|bf16|both]
//              [--engine own|onednn|both] [--shapes llama|gpt2|all|NAME] [--block-cols C]
//              [--huge-pages on|off|both]
// (--block-cols: the width of the column blocks instead of PackedGemm's rule; --huge-pages:
// the packed weights, and the read, in transparent huge pages or in 4 KiB pages)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/kernels/gemm_tuning.h"
#include "cpu/kernels/packed_gemm.h"
#include "graphfuse/thread_pool.h"

namespace {

using graphfuse::ThreadPool;
using graphfuse::kernels::GemmEngine;
using graphfuse::kernels::PackedGemm;
using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Sums `n` floats split over the pool's threads (64 independent sums: four AVX-512 vectors, so
// that the loads, not one chain of dependent adds, bound it): the read bandwidth a stream of n
// floats can have here.
float ReadAll(ThreadPool& pool, int threads, const float* x, int64_t n) {
  constexpr int kSums = 64;
  std::vector<float> partial(static_cast<size_t>(threads) * kSums, 0.f);
  pool.Parallel(threads, [&](int tid, int nt) {
    const int64_t lo = n * tid / nt, hi = n * (tid + 1) / nt;
    float s[kSums] = {};
    int64_t i = lo;
    for (; i + kSums <= hi; i += kSums)
      for (int j = 0; j < kSums; ++j) s[j] += x[i + j];
    for (; i < hi; ++i) s[0] += x[i];
    for (int j = 0; j < kSums; ++j) partial[static_cast<size_t>(tid) * kSums + static_cast<size_t>(j)] = s[j];
  });
  float t = 0;
  for (float v : partial) t += v;
  return t;
}

// One GEMM as the kernels run it: A converted to bf16 once where the blocks read it so
// (PackedGemm::ConvertA), then the blocks spread over the pool.
void RunGemm(ThreadPool& pool, int threads, const PackedGemm& g, const float* a, float* c) {
  std::atomic<int64_t> next{0};
  thread_local std::vector<uint16_t> a16_buf;
  const uint16_t* a16 = g.ConvertA(a, a16_buf);
  const int nt = static_cast<int>(std::min<int64_t>(threads, g.blocks()));
  pool.Parallel(nt, [&](int, int) {
    for (int64_t b = next.fetch_add(1); b < g.blocks(); b = next.fetch_add(1)) g.RunBlock(b, a, c, {}, a16);
  });
}

// "1,4,8" as numbers; empty when any is not a positive number.
std::vector<int64_t> ParseList(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    const long long x = std::strtoll(p, &end, 10);
    if (end == p || x <= 0 || (*end != ',' && *end != 0)) return {};
    v.push_back(x);
    p = *end == ',' ? end + 1 : end;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, samples = 15;
  std::vector<int64_t> rows = {1, 4, 8, 32};
  std::string storage = "both";
  std::string engine = "both", which_shapes = "llama";
  int64_t block_cols = 0;
  std::string huge = "on";
  const char* usage =
      "usage: bench_gemm [--threads T] [--samples S] [--rows M,M,...] [--storage f32|bf16|both]\n"
      "                  [--engine own|onednn|both] [--shapes llama|gpt2|all|NAME] [--block-cols C]\n"
      "                  [--huge-pages on|off|both]\n"
      "(--shapes NAME: the shapes whose name contains NAME, e.g. lm_head)\n";
  for (int i = 1; i < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--help" || f == "-h") {
      std::printf("%s", usage);
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_gemm: %s needs a value\n%s", f.c_str(), usage);
      return 2;
    }
    if (f == "--threads") threads = std::atoi(argv[i + 1]);
    else if (f == "--samples") samples = std::atoi(argv[i + 1]);
    else if (f == "--rows") rows = ParseList(argv[i + 1]);
    else if (f == "--storage") storage = argv[i + 1];
    else if (f == "--block-cols") block_cols = std::atoll(argv[i + 1]);
    else if (f == "--engine") engine = argv[i + 1];
    else if (f == "--shapes") which_shapes = argv[i + 1];
    else if (f == "--huge-pages") huge = argv[i + 1];
    else {
      std::fprintf(stderr, "bench_gemm: unknown flag %s\n%s", f.c_str(), usage);
      return 2;
    }
  }
  if (threads < 1 || samples < 1 || rows.empty()) {
    std::fprintf(stderr, "bench_gemm: --threads, --samples and --rows need positive values\n");
    return 2;
  }
  struct Shape {
    const char* name;
    int64_t k, n;
    bool llama;
  };
  const Shape all_shapes[] = {{"q/k/v/o 4096x4096", 4096, 4096, true}, {"gate/up 4096x11008", 4096, 11008, true},
                              {"down 11008x4096", 11008, 4096, true},  {"lm_head 4096x32000", 4096, 32000, true},
                              {"out 1024x32000", 1024, 32000, true},
                              {"qkv 768x2304", 768, 2304, false},
                              {"proj 768x768", 768, 768, false},       {"fc 768x3072", 768, 3072, false},
                              {"fc2 3072x768", 3072, 768, false}};
  std::vector<Shape> shapes;
  for (const Shape& s : all_shapes)
    if (which_shapes == "all" || (which_shapes == "llama" && s.llama) || (which_shapes == "gpt2" && !s.llama) ||
        std::string(s.name).find(which_shapes) != std::string::npos)
      shapes.push_back(s);
  if (shapes.empty()) {
    std::fprintf(stderr, "bench_gemm: no shape matches --shapes %s\n", which_shapes.c_str());
    return 2;
  }
  ThreadPool pool(threads);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::printf("PackedGemm against a same-run read of its weights, %d threads, medians of %d interleaved samples\n",
              threads, samples);
  std::printf("%-20s %4s %16s %9s %9s %9s %9s %8s %8s %s\n", "shape", "M", "engine", "gemm ms", "GB/s", "read ms",
              "GB/s", "of read", "GFLOP/s", "timed/rule");
  for (const Shape& s : shapes) {
    std::vector<float> b(static_cast<size_t>(s.k * s.n));
    for (float& x : b) x = u(rng);
    // The read's copy of b, in each kind of memory.
    std::vector<std::unique_ptr<void, void (*)(void*)>> reads;
    for (bool h : {false, true}) {
      reads.push_back(graphfuse::kernels::AllocateWeightMemory(b.size() * sizeof(float), h));
      std::memcpy(reads.back().get(), b.data(), b.size() * sizeof(float));
    }
    for (int64_t m : rows) {
      std::vector<float> a(static_cast<size_t>(m * s.k)), c(static_cast<size_t>(m * s.n));
      for (float& x : a) x = u(rng);
      for (const std::string st0 : {"f32 own", "f32 oneDNN", "bf16 own", "bf16 own-widen", "bf16 oneDNN"})
      for (const bool huge_pages : {true, false}) {
        if (huge != "both" && (huge == "on") != huge_pages) continue;
        const std::string st = huge == "both" ? st0 + (huge_pages ? " 2M" : " 4K") : st0;
        const bool bf16 = st.rfind("bf16", 0) == 0;
        const bool onednn = st.find("oneDNN") != std::string::npos;
        if (storage != "both" && storage != (bf16 ? "bf16" : "f32")) continue;
        if (engine != "both" && engine != (onednn ? "onednn" : "own")) continue;
        PackedGemm::Options o;
        o.storage = bf16 ? PackedGemm::WeightStorage::kBF16 : PackedGemm::WeightStorage::kF32;
        o.engine = onednn ? GemmEngine::kOneDnn : GemmEngine::kOwn;
        // "own-widen": the own loops with the weights widened to f32 as they are loaded (the stream
        // up to 8 rows), not the bf16 dot products (where the CPU has them; else the same as own).
        const bool widen = st0.find("widen") != std::string::npos;
        if (widen && !PackedGemm::OwnBf16Dot()) continue;
        o.bf16_dot = !widen;
        const bool rule = PackedGemm::AutoEngine(m, o.storage) == o.engine && !widen;
        const graphfuse::kernels::GemmChoice choice = graphfuse::kernels::ChooseGemmEngine(
            m, s.k, s.n, o.storage, false, {.measure = true, .threads = threads, .cache_dir = {}});
        const bool timed = choice.engine == o.engine && (onednn || !bf16 || choice.bf16_dot == !widen);
        o.block_cols = block_cols;
        o.huge_pages = huge_pages;
        const float* read = static_cast<const float*>(reads[huge_pages ? 1 : 0].get());
        auto g = PackedGemm::Create(m, s.k, s.n, b.data(), s.n, s.n, {}, o);
        if (!g.ok()) {
          std::fprintf(stderr, "%s\n", g.status().ToString().c_str());
          return 1;
        }
        // The read covers as many bytes as the packed weights: b itself (f32), or its first half.
        const int64_t floats = bf16 ? s.k * s.n / 2 : s.k * s.n;
        const double bytes = static_cast<double>(floats) * 4;
        std::vector<double> tg, tr;
        volatile float sink = 0;
        RunGemm(pool, threads, **g, a.data(), c.data());  // warm
        sink = sink + ReadAll(pool, threads, read, floats);
        for (int i = 0; i < samples; ++i) {
          auto t0 = Clock::now();
          RunGemm(pool, threads, **g, a.data(), c.data());
          auto t1 = Clock::now();
          sink = sink + ReadAll(pool, threads, read, floats);
          auto t2 = Clock::now();
          tg.push_back(Ms(t0, t1));
          tr.push_back(Ms(t1, t2));
        }
        const double mg = Median(tg), mr = Median(tr);
        const double gflops = 2.0 * static_cast<double>(m * s.k * s.n) / mg / 1e6;
        std::printf("%-20s %4lld %16s %9.3f %9.1f %9.3f %9.1f %7.0f%% %8.1f %s%s\n", s.name,
                    static_cast<long long>(m), st.c_str(), mg, bytes / mg / 1e6, mr, bytes / mr / 1e6, 100 * mr / mg,
                    gflops, timed ? "*" : " ", rule ? "r" : "");
      }
    }
  }
  return 0;
}
