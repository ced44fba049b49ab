// Micro-benchmarks of the elementwise operator library, beside the ceilings they are judged by.
//
//   BM_Op/<Op>/<n>/threads:<T>        one public RunOp launch of every op in the table (f32 data)
//   BM_StreamCopy|Triad/<n>/threads:<T>  STREAM-style plain loops split over the same pool
//   BM_HandGelu|Silu|Add/<n>/threads:<T> the fastest hand-written AVX-512 + libmvec loops
//   (the copy/triad/hand loops live in hand_loops.h, shared with bench_ratios)
//   BM_DispatchEmpty/threads:<T>      ThreadPool::Run with an empty task
//   BM_AddPublicPath/4096             RunOp(Add) on 4096 elements, the library choosing threads
//   BM_OmpEmptyRegion/threads:2       an empty libgomp parallel region, for comparison
//
// Bytes are the minimum traffic (every input read once, the output written once: the STREAM
// convention), reported as bytes_per_second and as the "GBps" counter (10^9 bytes/s).
// Inputs are uniform in [-3, 3] without zeros (positive for Log/Sqrt/Rsqrt and Pow's base),
// generated once per size with a fixed seed and shared by every benchmark of that size. Each
// benchmark checks a few output elements against the float64 reference before timing, so a
// broken kernel fails loudly (SkipWithError) instead of timing garbage.
// Repetitions are left to the command line: --benchmark_repetitions=N
// --benchmark_report_aggregates_only=true gives medians.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/tile_program.h"
#include "graphfuse/cpu.h"
#include "graphfuse/ops.h"
#include "graphfuse/tensor.h"
#include "graphfuse/thread_pool.h"
#include "hand_loops.h"
#include "ops/reference.h"

namespace gf = graphfuse;
namespace gfb = graphfuse::bench;

namespace {

constexpr int64_t kSizes[] = {4096, 65536, int64_t{1} << 20, int64_t{1} << 24};
constexpr int kThreadCounts[] = {1, 2};
constexpr int64_t kBiasWidth = 4096;  // Bias runs on [n / 4096, 4096] with a [4096] bias
constexpr uint32_t kSeed = 20240611;

// ---------------------------------------------------------------------------------------------
// Inputs and outputs, one set per size, allocated and filled once and reused by every benchmark.

struct Buffers {
  int64_t n = 0;
  gf::Tensor x, y, z;  // f32 uniform in [-3, 3], |v| >= 1e-3
  gf::Tensor pos;      // |x|: in [1e-3, 3]
  gf::Tensor c1, c2;   // bool, 0/1 at random
  gf::Tensor bias;     // f32 [kBiasWidth]
  gf::Tensor out_f32, out_bool, out_f16;
};

using gf::bench::Alloc;
using gf::bench::FillUniform;

std::unique_ptr<Buffers> MakeBuffers(int64_t n) {
  auto b = std::make_unique<Buffers>();
  b->n = n;
  std::mt19937 rng(kSeed ^ static_cast<uint32_t>(n));
  b->x = Alloc(gf::DType::kF32, n);
  b->y = Alloc(gf::DType::kF32, n);
  b->z = Alloc(gf::DType::kF32, n);
  FillUniform(b->x, rng);
  FillUniform(b->y, rng);
  FillUniform(b->z, rng);
  b->pos = Alloc(gf::DType::kF32, n);
  for (int64_t i = 0; i < n; ++i) b->pos.data_as<float>()[i] = std::fabs(b->x.data_as<float>()[i]);
  b->c1 = Alloc(gf::DType::kBool, n);
  b->c2 = Alloc(gf::DType::kBool, n);
  std::bernoulli_distribution coin(0.5);
  for (int64_t i = 0; i < n; ++i) b->c1.data_as<uint8_t>()[i] = coin(rng);
  for (int64_t i = 0; i < n; ++i) b->c2.data_as<uint8_t>()[i] = coin(rng);
  b->bias = Alloc(gf::DType::kF32, kBiasWidth);
  FillUniform(b->bias, rng);
  // Outputs are touched now so that no benchmark pays their first-touch page faults.
  b->out_f32 = Alloc(gf::DType::kF32, n);
  b->out_bool = Alloc(gf::DType::kBool, n);
  b->out_f16 = Alloc(gf::DType::kF16, n);
  for (gf::Tensor* t : {&b->out_f32, &b->out_bool, &b->out_f16}) std::memset(t->data(), 0, t->nbytes());
  return b;
}

// Owned by main and passed to every benchmark: the pool and the per-size buffers.
struct BenchEnv {
  gf::ThreadPool pool{2};
  std::map<int64_t, std::unique_ptr<Buffers>> buffers;

  Buffers& For(int64_t n) {
    auto& slot = buffers[n];
    if (!slot) slot = MakeBuffers(n);
    return *slot;
  }
};

// ---------------------------------------------------------------------------------------------
// BM_Op: one op of the table per launch through the public RunOp.

struct OpCase {
  std::vector<gf::TensorView> ins;
  gf::TensorView out;
  gf::OpAttrs attrs;
};

gf::TensorView ViewAs(const gf::Tensor& t, gf::Shape shape) { return gf::TensorView{t.dtype(), std::move(shape), const_cast<void*>(t.data())}; }

OpCase MakeCase(const gf::OpInfo& op, Buffers& b) {
  const int64_t n = b.n;
  OpCase c;
  c.attrs = gf::DefaultAttrs(op.kind);
  c.out = b.out_f32.view();
  const gf::Tensor* first = &b.x;
  switch (op.kind) {
    case gf::OpKind::kLog:
    case gf::OpKind::kSqrt:
    case gf::OpKind::kRsqrt:
    case gf::OpKind::kPow:
      first = &b.pos;
      break;
    default:
      break;
  }
  switch (op.cls) {
    case gf::OpClass::kLogical:
      c.ins = {b.c1.view(), b.c2.view()};
      c.ins.resize(op.arity);
      c.out = b.out_bool.view();
      return c;
    case gf::OpClass::kCompare:
      c.ins = {b.x.view(), b.y.view()};
      c.out = b.out_bool.view();
      return c;
    case gf::OpClass::kSelect:
      c.ins = {b.c1.view(), b.x.view(), b.y.view()};
      return c;
    case gf::OpClass::kCast:
      // f32 -> f16: a real conversion (f32 -> f32 would be a plain copy).
      c.attrs.to = gf::DType::kF16;
      c.ins = {b.x.view()};
      c.out = b.out_f16.view();
      return c;
    default:
      break;
  }
  if (op.kind == gf::OpKind::kBias) {
    const gf::Shape s{n / kBiasWidth, kBiasWidth};
    c.ins = {ViewAs(b.x, s), b.bias.view()};
    c.out = ViewAs(b.out_f32, s);
    return c;
  }
  if (op.kind == gf::OpKind::kDropout) {
    c.attrs.training = true;
    c.attrs.alpha = 0.1f;
    c.attrs.seed = 42;
  }
  c.ins = {first->view(), b.y.view(), b.z.view()};
  c.ins.resize(op.arity);
  return c;
}

int64_t Bytes(const gf::TensorView& t) { return t.numel() * static_cast<int64_t>(gf::DTypeSize(t.dtype)); }

// Compares a few output elements with the float64 reference; an empty string when they agree.
std::string CheckOutput(gf::OpKind kind, const OpCase& c) {
  const int64_t n = c.out.numel();
  for (int64_t i : {int64_t{0}, int64_t{1}, n / 2 + 3, n - 1}) {
    double v[3] = {0, 0, 0};
    for (size_t k = 0; k < c.ins.size(); ++k) v[k] = gf::LoadAsDouble(c.ins[k], i % c.ins[k].numel());
    const double ref = gf::ReferenceScalar(kind, v[0], v[1], v[2], c.attrs, i);
    const double want = c.out.dtype == gf::DType::kBool ? (ref != 0 ? 1.0 : 0.0)
                                                         : gf::RoundToDType(static_cast<float>(ref), c.out.dtype);
    const double got = gf::LoadAsDouble(c.out, i);
    const bool ok = (std::isnan(want) && std::isnan(got)) || std::fabs(got - want) <= 1e-5 * std::fabs(want) + 1e-6;
    if (!ok) {
      char msg[256];
      std::snprintf(msg, sizeof msg, "%s: element %lld is %.9g, the reference gives %.9g", gf::OpName(kind),
                    static_cast<long long>(i), got, want);
      return msg;
    }
  }
  return {};
}

void SetTraffic(benchmark::State& state, int64_t bytes_per_iter) {
  const double bytes = static_cast<double>(state.iterations()) * static_cast<double>(bytes_per_iter);
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["GBps"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
}

void BM_Op(benchmark::State& state, BenchEnv* env, gf::OpKind kind, int64_t n, int threads) {
  const gf::OpInfo& op = gf::GetOpInfo(kind);
  Buffers& b = env->For(n);
  const OpCase c = MakeCase(op, b);
  const gf::CpuContext ctx{&env->pool, threads};
  const std::span<const gf::TensorView> ins(c.ins);

  // One checked run before timing: poison the output so a stale result from an earlier
  // benchmark on the same buffer cannot pass for this one's.
  std::memset(c.out.data, 0xFF, static_cast<size_t>(Bytes(c.out)));
  gf::Status s = gf::RunOp(kind, ins, c.out, c.attrs, ctx);
  if (!s.ok()) return state.SkipWithError(s.ToString().c_str());
  if (std::string err = CheckOutput(kind, c); !err.empty()) return state.SkipWithError(err.c_str());

  for (auto _ : state) {
    gf::Status st = gf::RunOp(kind, ins, c.out, c.attrs, ctx);
    if (!st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      break;
    }
  }
  benchmark::ClobberMemory();

  int64_t bytes = Bytes(c.out);
  for (const gf::TensorView& t : c.ins) bytes += Bytes(t);
  SetTraffic(state, bytes);
  // The threads this launch runs on, as the library decides them (it caps at `threads`).
  const int64_t tiles = (n + gf::cpu::kTileElements - 1) / gf::cpu::kTileElements;
  state.counters["threads"] = static_cast<double>(std::min<int64_t>(ctx.ThreadsFor(n * std::max(op.cost, 1)), tiles));
}

// ---------------------------------------------------------------------------------------------
// The ceilings: STREAM loops and hand-written AVX-512 loops (hand_loops.h) on the same pool.

template <class Call>
void RunLoop(benchmark::State& state, Call call) {
  for (auto _ : state) call();
  benchmark::ClobberMemory();
}

void BM_StreamCopy(benchmark::State& state, BenchEnv* env, int64_t n, int threads) {
  Buffers& b = env->For(n);
  const float* x = b.x.data_as<float>();
  float* out = b.out_f32.data_as<float>();
  RunLoop(state, [&] { gfb::StreamCopy(env->pool, x, out, n, threads); });
  if (out[n - 1] != x[n - 1]) return state.SkipWithError("copy: wrong result");
  SetTraffic(state, n * 8);
}

void BM_StreamTriad(benchmark::State& state, BenchEnv* env, int64_t n, int threads) {
  Buffers& b = env->For(n);
  const float* x = b.x.data_as<float>();
  const float* y = b.y.data_as<float>();
  float* out = b.out_f32.data_as<float>();
  constexpr float kS = 3.f;
  RunLoop(state, [&] { gfb::StreamTriad(env->pool, x, y, kS, out, n, threads); });
  if (std::fabs(out[n - 1] - (x[n - 1] + kS * y[n - 1])) > 1e-5f) return state.SkipWithError("triad: wrong result");
  SetTraffic(state, n * 12);
}

#ifdef __AVX512F__
void BM_HandGelu(benchmark::State& state, BenchEnv* env, int64_t n, int threads) {
  Buffers& b = env->For(n);
  const float* x = b.x.data_as<float>();
  float* out = b.out_f32.data_as<float>();
  RunLoop(state, [&] { gfb::HandGelu(env->pool, x, out, n, threads); });
  const double v = x[n - 1];
  if (!gfb::Near(out[n - 1], 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))))
    return state.SkipWithError("gelu: wrong result");
  SetTraffic(state, n * 8);
}

void BM_HandSilu(benchmark::State& state, BenchEnv* env, int64_t n, int threads) {
  Buffers& b = env->For(n);
  const float* x = b.x.data_as<float>();
  float* out = b.out_f32.data_as<float>();
  RunLoop(state, [&] { gfb::HandSilu(env->pool, x, out, n, threads); });
  const double v = x[n - 1];
  if (!gfb::Near(out[n - 1], v / (1 + std::exp(-v)))) return state.SkipWithError("silu: wrong result");
  SetTraffic(state, n * 8);
}

void BM_HandAdd(benchmark::State& state, BenchEnv* env, int64_t n, int threads) {
  Buffers& b = env->For(n);
  const float* x = b.x.data_as<float>();
  const float* y = b.y.data_as<float>();
  float* out = b.out_f32.data_as<float>();
  RunLoop(state, [&] { gfb::HandAdd(env->pool, x, y, out, n, threads); });
  if (out[n - 1] != x[n - 1] + y[n - 1]) return state.SkipWithError("add: wrong result");
  SetTraffic(state, n * 12);
}
#endif  // __AVX512F__

// ---------------------------------------------------------------------------------------------
// Dispatch cost.

void BM_DispatchEmpty(benchmark::State& state, BenchEnv* env, int threads) {
  for (auto _ : state) env->pool.Run(threads, [](void*, int, int) {}, nullptr);
}

void BM_AddPublicPath(benchmark::State& state, BenchEnv* env) {
  // The library picks the threads (max 2): the per-op cost a user sees on a small tensor.
  BM_Op(state, env, gf::OpKind::kAdd, 4096, 2);
}

#ifdef _OPENMP
void BM_OmpEmptyRegion(benchmark::State& state) {
  for (auto _ : state) {
#pragma omp parallel num_threads(2)
    { benchmark::ClobberMemory(); }
  }
}
#endif

std::string Name(const char* base, int64_t n, int threads) {
  return std::string(base) + "/" + std::to_string(n) + "/threads:" + std::to_string(threads);
}

}  // namespace

int main(int argc, char** argv) {
  BenchEnv env;
  BenchEnv* e = &env;
  using benchmark::RegisterBenchmark;

  for (const gf::OpInfo& op : gf::AllOps()) {
    for (int64_t n : kSizes) {
      for (int t : kThreadCounts) {
        const std::string name = Name((std::string("BM_Op/") + op.name).c_str(), n, t);
        RegisterBenchmark(name.c_str(), BM_Op, e, op.kind, n, t)->UseRealTime()->Unit(benchmark::kMicrosecond);
      }
    }
  }
  using SplitFn = void (*)(benchmark::State&, BenchEnv*, int64_t, int);
  const std::pair<const char*, SplitFn> split[] = {
      {"BM_StreamCopy", BM_StreamCopy}, {"BM_StreamTriad", BM_StreamTriad},
#ifdef __AVX512F__
      {"BM_HandGelu", BM_HandGelu},     {"BM_HandSilu", BM_HandSilu},       {"BM_HandAdd", BM_HandAdd},
#endif
  };
  for (const auto& [base, fn] : split)
    for (int64_t n : kSizes)
      for (int t : kThreadCounts)
        RegisterBenchmark(Name(base, n, t).c_str(), fn, e, n, t)->UseRealTime()->Unit(benchmark::kMicrosecond);

  for (int t : kThreadCounts)
    RegisterBenchmark(("BM_DispatchEmpty/threads:" + std::to_string(t)).c_str(), BM_DispatchEmpty, e, t)
        ->UseRealTime();
  RegisterBenchmark("BM_AddPublicPath/4096", BM_AddPublicPath, e)->UseRealTime();
#ifdef _OPENMP
  // Last: libgomp's workers keep spinning for a while after a region, which would steal the
  // second core from whatever ran next.
  RegisterBenchmark("BM_OmpEmptyRegion/threads:2", BM_OmpEmptyRegion)->UseRealTime();
#endif

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
