// Google Benchmark rows for fusion: each preset (testing/presets.cc) as its unfused plan, its
// fused plan (tile executor), the fused plan as native loops (graphfuse/cpu_codegen.h), and a
// hand-written fused AVX-512 loop (libmvec erf/exp, bench/hand_loops.h) at
// 4Ki, 64Ki, 1Mi and 16Mi f32 elements, on the same 2-thread pool. Every variant's output is
// checked before timing. BM_PlanElementwise times the planner alone (FuseElementwise) on a
// chain of model-like blocks, 8 nodes each. Run with --benchmark_repetitions=N
// --benchmark_report_aggregates_only.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_target.h"
#include "graphfuse/cpu.h"
#include "graphfuse/cpu_codegen.h"
#include "hand_loops.h"
#include "ir/text.h"
#include "passes/fuse_elementwise.h"
#include "passes/pipeline.h"
#include "cpu/executor.h"
#include "testing/presets.h"

namespace gf = graphfuse;

namespace {

constexpr int64_t kCols = 4096;
const int64_t kSizes[] = {4096, 65536, 1 << 20, 1 << 24};

struct Case {
  std::unique_ptr<gf::Graph> unfused, fused;
  std::unique_ptr<gf::ExecutionPlan> unfused_plan, fused_plan, native_plan;
  std::vector<gf::Tensor> in;
  gf::Tensor out;
  std::vector<gf::TensorView> in_views;
  gf::TensorView out_view;
  int64_t io_bytes = 0;
};

gf::ThreadPool& Pool() {
  static gf::ThreadPool pool(2);
  return pool;
}

std::unique_ptr<Case> MakeCase(const gf::ElementwisePreset& p, int64_t n) {
  auto c = std::make_unique<Case>();
  const std::string text = p.text(n / kCols, kCols);
  c->unfused = std::move(gf::ParseGraph(text).value());
  c->fused = std::move(gf::ParseGraph(text).value());
  gf::PipelineOptions off;
  off.fusion.enabled = false;
  (void)gf::RunPipeline(*c->unfused, gf::cpu::DefaultCpuTarget(), off).value();
  (void)gf::RunPipeline(*c->fused, gf::cpu::DefaultCpuTarget()).value();
  c->unfused_plan = std::move(gf::ExecutionPlan::Compile(*c->unfused).value());
  c->fused_plan = std::move(gf::ExecutionPlan::Compile(*c->fused).value());
  c->native_plan = std::move(gf::ExecutionPlan::Compile(*c->fused).value());
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (const gf::Value* v : c->unfused->inputs()) {
    gf::Tensor t = gf::Tensor::Empty(v->dtype(), v->shape()).value();
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = u(rng);
    c->io_bytes += static_cast<int64_t>(t.nbytes());
    c->in.push_back(std::move(t));
  }
  for (const gf::Tensor& t : c->in) c->in_views.push_back(t.view());
  const gf::Value* o = c->unfused->outputs()[0];
  c->out = gf::Tensor::Empty(o->dtype(), o->shape()).value();
  c->io_bytes += static_cast<int64_t>(c->out.nbytes());
  c->out_view = c->out.view();
  return c;
}

// Hand-written fused loops, one per preset (row-wise: the [C] operands are per column).
#ifdef __AVX512F__
int ThreadsFor(int64_t n, int64_t cost) { return gf::CpuContext{&Pool()}.ThreadsFor(n * cost); }

void HandChain(const std::vector<gf::Tensor>& in, float* u, int64_t n) {
  const float *x = in[0].data_as<float>(), *y = in[1].data_as<float>(), *b = in[2].data_as<float>();
  gf::bench::RunSplit(Pool(), n, ThreadsFor(n, 3), [&](gf::bench::Range r) {
    for (int64_t i = r.begin; i < r.end; i += 16) {
      const __m512 s = _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i));
      _mm512_storeu_ps(u + i, _mm512_fmadd_ps(s, _mm512_set1_ps(0.5f), _mm512_loadu_ps(b + i % kCols)));
    }
  });
}
void HandGeluChain(const std::vector<gf::Tensor>& in, float* y, int64_t n) {
  const float *x = in[0].data_as<float>(), *b = in[1].data_as<float>();
  gf::bench::RunSplit(Pool(), n, ThreadsFor(n, 12), [&](gf::bench::Range r) {
    for (int64_t i = r.begin; i < r.end; i += 16) {
      const __m512 t = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(1.25f), _mm512_loadu_ps(b + i % kCols));
      _mm512_storeu_ps(y + i, gf::bench::GeluErf(t));
    }
  });
}
void HandSiluMul(const std::vector<gf::Tensor>& in, float* y, int64_t n) {
  const float *g = in[0].data_as<float>(), *up = in[1].data_as<float>();
  gf::bench::RunSplit(Pool(), n, ThreadsFor(n, 8), [&](gf::bench::Range r) {
    for (int64_t i = r.begin; i < r.end; i += 16)
      _mm512_storeu_ps(y + i, _mm512_mul_ps(gf::bench::SiluExp(_mm512_loadu_ps(g + i)), _mm512_loadu_ps(up + i)));
  });
}
#endif

void SetBytes(benchmark::State& state, int64_t bytes) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * bytes);
}

// The code generator of the native rows (one per process; kernels cached on disk).
gf::CpuCodegen* Codegen() {
  static auto cg = gf::CpuCodegen::Create();
  return cg.ok() ? cg->get() : nullptr;
}

enum class Variant { kUnfused, kFused, kNative };

void BM_Plan(benchmark::State& state, const gf::ElementwisePreset* p, int64_t n, Variant v) {
  static std::map<std::pair<std::string, int64_t>, std::unique_ptr<Case>> cache;
  auto& c = cache[{p->name, n}];
  if (!c) c = MakeCase(*p, n);
  gf::ExecutionPlan& plan =
      v == Variant::kUnfused ? *c->unfused_plan : v == Variant::kFused ? *c->fused_plan : *c->native_plan;
  gf::CpuContext ctx{&Pool()};
  if (v == Variant::kNative) {
    ctx.codegen = Codegen();
    if (!ctx.codegen) {
      state.SkipWithError("no working compiler for the code generator");
      return;
    }
    // Bit for bit the fused plan's output (the tile executor), checked before timing.
    gf::Tensor want = gf::Tensor::Empty(c->out.dtype(), c->out.shape()).value();
    gf::TensorView wv = want.view();
    (void)c->fused_plan->Run(c->in_views, {&wv, 1}, gf::CpuContext{&Pool()});
    if (auto s = plan.Run(c->in_views, {&c->out_view, 1}, ctx); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    if (std::memcmp(want.data(), c->out.data(), want.nbytes()) != 0) {
      state.SkipWithError("native loops disagree with the tile executor");
      return;
    }
  }
  if (auto s = plan.Run(c->in_views, {&c->out_view, 1}, ctx); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    (void)plan.Run(c->in_views, {&c->out_view, 1}, ctx);
    benchmark::ClobberMemory();
  }
  SetBytes(state, c->io_bytes);
  state.counters["kernels"] = static_cast<double>(plan.stats().kernels_launched);
}

#ifdef __AVX512F__
void BM_Hand(benchmark::State& state, const gf::ElementwisePreset* p, int64_t n) {
  auto c = MakeCase(*p, n);
  auto loop = std::string(p->name) == "chain" ? HandChain : std::string(p->name) == "gelu" ? HandGeluChain : HandSiluMul;
  // Check the hand loop against the unfused plan before timing it.
  gf::Tensor want = gf::Tensor::Empty(gf::DType::kF32, c->out.shape()).value();
  gf::TensorView wv = want.view();
  (void)c->unfused_plan->Run(c->in_views, {&wv, 1}, gf::CpuContext{&Pool()});
  loop(c->in, c->out.data_as<float>(), n);
  for (int64_t i = 0; i < n; i += 97)
    if (!gf::bench::Near(c->out.data_as<float>()[i], want.data_as<float>()[i]) &&
        std::fabs(c->out.data_as<float>()[i] - want.data_as<float>()[i]) > 1e-5f) {
      state.SkipWithError("hand loop disagrees with the unfused plan");
      return;
    }
  for (auto _ : state) {
    loop(c->in, c->out.data_as<float>(), n);
    benchmark::ClobberMemory();
  }
  SetBytes(state, c->io_bytes);
}
#endif

// `blocks` blocks of MatMul -> bias, GELU, product, residual, sigmoid -> row mean -> centring:
// each block leaves one fused group beside a MatMul and a reduction.
std::string BlockChainText(int blocks) {
  std::string s = "graph @blocks(%x: f32[16,64], %w: f32[64,64], %b: f32[64]) {\n", cur = "x";
  for (int k = 0; k < blocks; ++k) {
    const std::string i = std::to_string(k);
    s += "  %m" + i + " = MatMul(%" + cur + ", %w)\n  %a" + i + " = Add(%m" + i + ", %b)\n  %g" + i + " = Gelu(%a" + i +
         ")\n  %c" + i + " = Mul(%g" + i + ", %a" + i + ")\n  %d" + i + " = Add(%c" + i + ", %" + cur + ")\n  %e" + i +
         " = Sigmoid(%d" + i + ")\n  %r" + i + " = ReduceMean(%e" + i + ") {axes = [-1], keepdims = 1}\n  %f" + i +
         " = Sub(%d" + i + ", %r" + i + ")\n";
    cur = "f" + i;
  }
  return s + "  return %" + cur + "\n}\n";
}

void BM_PlanElementwise(benchmark::State& state) {
  const std::string text = BlockChainText(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    state.PauseTiming();
    auto g = gf::ParseGraph(text).value();
    state.ResumeTiming();
    auto r = gf::FuseElementwise(*g);
    if (!r.ok() || static_cast<int64_t>(r->groups.size()) != state.range(0)) state.SkipWithError("unexpected plan");
  }
  state.counters["nodes"] = static_cast<double>(8 * state.range(0));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("BM_PlanElementwise", BM_PlanElementwise)->Arg(125)->Arg(250)->Arg(500)->Arg(1000)
      ->Unit(benchmark::kMillisecond);
  for (const gf::ElementwisePreset& p : gf::ElementwisePresets()) {
    const std::string name = p.name;
    for (int64_t n : kSizes) {
      benchmark::RegisterBenchmark(("BM_Unfused/" + name + "/" + std::to_string(n)).c_str(), BM_Plan, &p, n,
                                   Variant::kUnfused)
          ->UseRealTime();
      benchmark::RegisterBenchmark(("BM_Fused/" + name + "/" + std::to_string(n)).c_str(), BM_Plan, &p, n,
                                   Variant::kFused)
          ->UseRealTime();
      benchmark::RegisterBenchmark(("BM_FusedNative/" + name + "/" + std::to_string(n)).c_str(), BM_Plan, &p, n,
                                   Variant::kNative)
          ->UseRealTime();
#ifdef __AVX512F__
      if (name != "residual")
        benchmark::RegisterBenchmark(("BM_HandFused/" + name + "/" + std::to_string(n)).c_str(), BM_Hand, &p, n)
            ->UseRealTime();
#endif
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
