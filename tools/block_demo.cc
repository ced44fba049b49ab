// `graphfuse demo`: a transformer block built with the graph API (LLaMA-7B shapes by default),
// run unfused (every op its own kernel) and fused (the whole pipeline), checked equal, timed
// interleaved, and printed as a table: kernels, dispatch overhead, time outside GEMMs,
// latency, bytes moved. `--preset elementwise` runs the op-library demo instead.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cli_common.h"
#include "compare.h"
#include "cpu/elementwise_kernels.h"
#include "fusion_report.h"
#include "core/json.h"
#include "ir/op_registry.h"
#include "passes/convert_precision.h"
#include "passes/pipeline.h"
#include "graphfuse/cpu_codegen.h"
#include "testing/blocks.h"
#include "cpu/executor.h"
#include "testing/timer.h"
#ifdef GF_HAVE_CUDA
#include "cuda/cuda_executor.h"
#endif

namespace graphfuse::cli {

int RunElementwiseDemo(Args& args);  // demo.cc

namespace {

struct BlockDemoOptions {
  std::string preset = "llama7b";
  int64_t seq = -1;  // preset's
  int64_t past = 0;  // rows of a KV cache before them (--past)
  int threads = 0;
  int repeats = 11;
  bool profile = false;
  bool cpu_codegen = false;  // the fused plan's elementwise programs as native loops
  double rtol = 1e-3, atol = 1e-4;
  bool rtol_set = false, atol_set = false;
  bool emulate_gpu = false;  // --backend cuda's plans on the host (host_emulation.h)
  DType dtype = DType::kF32;  // what the GPU's plans compute in (--dtype)
  std::string json, backend = "cpu";
};

Result<BlockDemoOptions> ParseBlockDemo(Args& args) {
  BlockDemoOptions o;
  while (!args.Done()) {
    const std::string f = args.Next();
    if (f == "--preset") {
      GF_ASSIGN_OR_RETURN(o.preset, args.Value(f));
    } else if (f == "--seq") {
      GF_ASSIGN_OR_RETURN(o.seq, args.Int(f, 1, 8192));
    } else if (f == "--past") {
      GF_ASSIGN_OR_RETURN(o.past, args.Int(f, 0, 32768));
    } else if (f == "--dtype") {
      GF_ASSIGN_OR_RETURN(o.dtype, args.Dtype(f));
    } else if (f == "--emulate-gpu") {
      o.emulate_gpu = true;
    } else if (f == "--threads") {
      GF_ASSIGN_OR_RETURN(int64_t t, args.Int(f, 1, 256));
      o.threads = static_cast<int>(t);
    } else if (f == "--repeats") {
      GF_ASSIGN_OR_RETURN(int64_t r, args.Int(f, 1, 1001));
      o.repeats = static_cast<int>(r);
    } else if (f == "--rtol") {
      GF_ASSIGN_OR_RETURN(o.rtol, args.Float(f, 0, 1));
      o.rtol_set = true;
    } else if (f == "--atol") {
      GF_ASSIGN_OR_RETURN(o.atol, args.Float(f, 0, 1e6));
      o.atol_set = true;
    } else if (f == "--json") {
      GF_ASSIGN_OR_RETURN(o.json, args.OutputFile(f));
    } else if (f == "--profile") {
      o.profile = true;
    } else if (f == "--cpu-codegen") {
      o.cpu_codegen = true;
    } else if (f == "--backend") {
      GF_ASSIGN_OR_RETURN(o.backend, args.Backend(f));
    } else {
      return InvalidArgument("demo: unknown flag '", f,
                             "' (flags: --preset NAME --seq N --past L --threads T --repeats R --rtol R --atol A "
                             "--profile --cpu-codegen --backend cpu|cuda --emulate-gpu --dtype f32|bf16|f16 --json FILE)");
    }
  }
  if (o.emulate_gpu && o.backend != "cuda") return InvalidArgument("demo: --emulate-gpu needs --backend cuda");
  GF_RETURN_IF_ERROR(CheckDtypeBackend("demo", o.dtype, o.backend));
  // bf16 GEMM weights on the CPU: the fused plan rounds weights its folds scaled (an RMSNorm's
  // scale folded into the next GEMM), the unfused plan the weights as written, so the two agree
  // within bf16's tolerance, not f32's.
  if (o.backend == "cpu" && o.dtype == DType::kBF16) {
    if (!o.rtol_set) o.rtol = NarrowTolerance(DType::kBF16);
    if (!o.atol_set) o.atol = NarrowTolerance(DType::kBF16);
  }
  return o;
}

// One plan's figures.
struct PlanFigures {
  int64_t kernels = 0;
  double latency_ms = 0, outside_gemm_ms = 0, gemm_ms = 0, bytes = 0;
  struct Step {
    std::string name;  // "node (op)"
    double ms;         // median
    double gemm_share;  // of its time, GEMM work
  };
  std::vector<Step> steps;
};

// Bytes each kernel reads and writes (every input and output once per launch).
double KernelBytes(const Graph& g) {
  double b = 0;
  for (const auto& n : g.nodes()) {
    const OpSchema* s = FindSchema(n->op());
    if (!s || s->view) continue;
    for (const Value* v : n->inputs())
      if (v) b += static_cast<double>(v->numel()) * static_cast<double>(DTypeSize(v->dtype()));
    for (const Value* v : n->outputs()) b += static_cast<double>(v->numel()) * static_cast<double>(DTypeSize(v->dtype()));
  }
  return b;
}

// Per-kernel times from observed runs (median over runs of each step), split into GEMM work
// and the rest. MatMul / Gemm kernels (the projections, and attention's score and context
// products in the unfused plan) are GEMM work. A fused kernel that calls BLAS inside (a GEMM
// with its epilogue, attention) is split by its counters: the share of its thread-time spent
// inside the BLAS calls is GEMM work, the rest (epilogue, softmax, RoPE) is not. The demo
// observes the two plans in alternating rounds, so that a slow spell of a shared machine falls
// on both; each round's own outside-GEMM total is kept for the median of per-round ratios.
class PlanProfile {
 public:
  Status Observe(ExecutionPlan& plan, std::span<const TensorView> in, std::span<const TensorView> out,
                 const CpuContext& ctx) {
    using Clock = std::chrono::steady_clock;
    KernelCounters counters;
    CpuContext counted = ctx;
    counted.counters = &counters;
    size_t step = 0;
    double outside = 0;
    auto last = Clock::now();
    ExecutionPlan::StepObserver obs = [&](const Node& n, std::span<const TensorView>, std::span<const TensorView>) {
      const double dt = std::chrono::duration<double>(Clock::now() - last).count();
      if (wall_.size() <= step) {
        wall_.emplace_back();
        gemm_share_.emplace_back();
        names_.push_back(StrCat(n.name(), " (", n.op(), ")"));
      }
      const int64_t blas = counters.blas_ns.exchange(0), task = counters.task_ns.exchange(0);
      const bool gemm_op = n.op() == "MatMul" || n.op() == "Gemm";
      const double share = gemm_op ? 1.0 : task > 0 ? std::min(1.0, static_cast<double>(blas) / task) : 0.0;
      wall_[step].push_back(dt);
      gemm_share_[step].push_back(share);
      outside += dt * (1 - share);
      ++step;
      last = Clock::now();
      return Status::Ok();
    };
    GF_RETURN_IF_ERROR(plan.Run(in, out, counted, &obs));
    round_outside_ms_.push_back(outside * 1e3);
    return Status::Ok();
  }
  // Per kernel: the median time and the median GEMM share of its runs; the totals sum them.
  void Finish(PlanFigures& f) const {
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    f.outside_gemm_ms = f.gemm_ms = 0;
    for (size_t s = 0; s < wall_.size(); ++s) {
      const double ms = median(wall_[s]) * 1e3, share = median(gemm_share_[s]);
      f.gemm_ms += ms * share;
      f.outside_gemm_ms += ms * (1 - share);
      f.steps.push_back({names_[s], ms, share});
    }
  }
  const std::vector<double>& round_outside_ms() const { return round_outside_ms_; }

 private:
  std::vector<std::vector<double>> wall_, gemm_share_;
  std::vector<std::string> names_;
  std::vector<double> round_outside_ms_;
};

std::string FamilyName(const BlockConfig& c) {
  switch (c.family) {
    case BlockFamily::kLlama: return "LLaMA";
    case BlockFamily::kGpt2: return "GPT-2";
    case BlockFamily::kBert: return "BERT";
  }
  return "";
}

}  // namespace

int RunDemo(Args& args) {
  // The op-library demo keeps its own flags.
  Args probe = args;
  bool elementwise = false;
  while (!probe.Done()) {
    const std::string f = probe.Next();
    if (f == "--preset" && !probe.Done()) elementwise |= probe.Next() == "elementwise";
  }
  if (elementwise) {
    std::vector<std::string> kept;
    while (!args.Done()) {
      const std::string f = args.Next();
      if (f == "--preset") args.Next();
      else kept.push_back(f);
    }
    Args ew(args.command(), kept);
    return RunElementwiseDemo(ew);
  }
  auto parsed = ParseBlockDemo(args);
  if (!parsed.ok()) return FailUsage("demo", parsed.status());
  const BlockDemoOptions o = *parsed;
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "graphfuse demo: %s\n", s.ToString().c_str());
    return kExitBadInput;
  };
  auto preset = BlockPreset(o.preset);
  if (!preset.ok()) return fail(preset.status().WithContext("--preset (or 'elementwise' for the op library)"));
  BlockConfig cfg = *preset;
  if (o.seq > 0) cfg.seq = o.seq;
  cfg.past = o.past;
  if (o.backend == "cuda" && !o.emulate_gpu)
    if (Status st = CheckCudaBackend(); !st.ok()) return fail(st);

  ThreadPool pool(o.threads);
  const CpuContext ctx{&pool, pool.num_threads()};
  const double weight_mb = static_cast<double>(cfg.WeightCount()) * 4 / 1e6;
  std::fprintf(stderr, "graphfuse demo: %s block, %.0f MB of random f32 weights\n", cfg.preset.c_str(), weight_mb);
  int shown = -1;  // the percentage last printed: each is printed once (logs read them in a row)
  auto weights = MakeBlockWeights(cfg, 7, ctx, [&](double frac) {
    const int pct = static_cast<int>(frac * 100 + 0.5);
    if (pct == shown) return;
    shown = pct;
    std::fprintf(stderr, "\r  generating weights: %3d%%", pct);
    std::fflush(stderr);
  });
  std::fprintf(stderr, "\n");
  if (!weights.ok()) return fail(weights.status());

  Graph unfused("unfused"), fused("fused");
  for (Graph* g : {&unfused, &fused})
    if (Status st = BuildBlock(*g, cfg, *weights); !st.ok()) return fail(st);
  // --dtype bf16 / f16: the GPU runs both plans of the block converted to that dtype (before
  // the passes), checked against the CPU's f32 unfused plan. Its inputs and outputs (x, y and
  // the KV cache) are in that dtype too, as a serving stack holds them: no casts at the edges.
  std::unique_ptr<Graph> narrow_u, narrow_f;
  if (o.dtype != DType::kF32 && o.backend == "cuda") {
    for (auto [src, dst] : {std::pair{&unfused, &narrow_u}, {&fused, &narrow_f}}) {
      auto converted = ConvertPrecision(*src, o.dtype, {.narrow_io = true});
      if (!converted.ok()) return fail(converted.status().WithContext(StrCat("--dtype ", DTypeName(o.dtype))));
      *dst = std::move(*converted);
    }
  }
  FusionReport report, narrow_report;
  PipelineOptions off, on;
  off.fusion.enabled = false;
  on.fusion_report = &report;
  auto target = MakeTarget(o.backend);
  if (!target.ok()) return fail(target.status());
  std::fprintf(stderr, "  planning (fusion passes)...\n");
  if (auto r = RunPipeline(unfused, **target, off); !r.ok()) return fail(r.status());
  if (auto r = RunPipeline(fused, **target, on); !r.ok()) return fail(r.status());
  if (narrow_u) {
    PipelineOptions narrow_on;
    narrow_on.fusion_report = &narrow_report;
    if (auto r = RunPipeline(*narrow_u, **target, off); !r.ok()) return fail(r.status().WithContext(DTypeName(o.dtype)));
    if (auto r = RunPipeline(*narrow_f, **target, narrow_on); !r.ok())
      return fail(r.status().WithContext(DTypeName(o.dtype)));
  }
  // --dtype bf16 on the CPU: both plans hold their GEMMs' weights in bf16.
  const PrepareOptions cpu_prepare{.bf16_weights = o.backend == "cpu" && o.dtype == DType::kBF16};
  auto plan_u = ExecutionPlan::Compile(unfused, cpu_prepare);
  if (!plan_u.ok()) return fail(plan_u.status());
  auto plan_f = ExecutionPlan::Compile(fused, cpu_prepare);
  if (!plan_f.ok()) return fail(plan_f.status());
  // --cpu-codegen: the fused plan's elementwise programs (groups, GEMM and norm epilogues) run
  // as native loops, compiled on their first run (cached on disk).
  std::unique_ptr<CpuCodegen> codegen;
  CpuContext ctx_f = ctx;
  if (o.cpu_codegen) {
    auto cg = AttachCodegen(ctx_f);
    if (!cg.ok()) return fail(cg.status());
    codegen = std::move(*cg);
    std::fprintf(stderr, "  native loops for the fused plan (kernel cache: %s)\n", codegen->cache_dir().c_str());
  }

  // Inputs: fresh random activations (not zeros) for x and the cache rows, in the order the
  // block declares them (x, then past_key and past_value); one set of output buffers per plan.
  for (size_t i = 0; i < unfused.inputs().size(); ++i)
    if (fused.inputs().size() != unfused.inputs().size() || fused.inputs()[i]->name() != unfused.inputs()[i]->name())
      return fail(Internal("the fused and unfused blocks declare different inputs"));
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<Tensor> xs, ys_u, ys_f;
  std::vector<TensorView> in_v, out_u_v, out_f_v;
  for (const Value* v : unfused.inputs()) {
    Tensor t = Tensor::Empty(DType::kF32, v->shape()).value();
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = u(rng);
    xs.push_back(std::move(t));
  }
  for (const Value* v : unfused.outputs()) {
    ys_u.push_back(Tensor::Empty(DType::kF32, v->shape()).value());
    ys_f.push_back(Tensor::Empty(DType::kF32, v->shape()).value());
  }
  for (const Tensor& t : xs) in_v.push_back(t.view());
  for (const Tensor& t : ys_u) out_u_v.push_back(t.view());
  for (const Tensor& t : ys_f) out_f_v.push_back(t.view());
  const std::span<const TensorView> in = in_v, out_u = out_u_v, out_f = out_f_v;
  // The same inputs rounded to --dtype, for the GPU's narrow plans.
  std::vector<Tensor> xs_narrow;
  std::vector<TensorView> in_narrow;
  if (o.dtype != DType::kF32) {
    for (const Tensor& t : xs) {
      Tensor n = Tensor::Empty(o.dtype, t.shape()).value();
      for (int64_t i = 0; i < t.numel(); ++i) n.SetFromDouble(i, t.data_as<float>()[i]);
      xs_narrow.push_back(std::move(n));
    }
    for (const Tensor& t : xs_narrow) in_narrow.push_back(t.view());
  }

  std::fprintf(stderr, "  checking fused against unfused...\n");
  if (Status st = (*plan_u)->Run(in, out_u, ctx); !st.ok()) return fail(st);
  if (Status st = (*plan_f)->Run(in, out_f, ctx_f); !st.ok()) return fail(st);
  // Every output (y, and the present rows with a cache), one figure over all.
  struct OutputCheck {
    std::string name;
    double max_abs = 0, max_rel = 0;
    bool ok = true;
  };
  std::vector<OutputCheck> output_checks;
  double max_abs = 0, max_rel = 0;
  int64_t bad = 0, nonfinite_u = 0, nonfinite_f = 0, compared = 0;
  for (size_t k = 0; k < ys_u.size(); ++k) {
    const Tensor &yu = ys_u[k], &yf = ys_f[k];
    OutputCheck c{unfused.outputs()[k]->name()};
    compared += yu.numel();
    for (int64_t i = 0; i < yu.numel(); ++i) {
      const double a = yf.data_as<float>()[i], b = yu.data_as<float>()[i];
      nonfinite_f += !std::isfinite(a);
      nonfinite_u += !std::isfinite(b);
      const double err = std::fabs(a - b);
      c.max_abs = std::max(c.max_abs, err);
      c.max_rel = std::max(c.max_rel, err / std::max(std::fabs(b), 1e-30));
      const bool bad_here = !(err <= o.atol + o.rtol * std::fabs(b));
      bad += bad_here;
      c.ok &= !bad_here;
    }
    max_abs = std::max(max_abs, c.max_abs), max_rel = std::max(max_rel, c.max_rel);
    output_checks.push_back(c);
  }
  const bool ok = bad == 0 && nonfinite_u == 0 && nonfinite_f == 0;
  // NaN / inf make no error figure: say how many there are instead.
  const std::string nonfinite =
      nonfinite_u + nonfinite_f == 0
          ? std::string()
          : StrCat("; NaN or inf values: ", nonfinite_f, " fused, ", nonfinite_u, " unfused, of ", compared);

  std::fprintf(stderr, "  timing (%d interleaved repeats)...\n", o.repeats);
  std::vector<std::function<void()>> variants = {[&] { (void)(*plan_u)->Run(in, out_u, ctx); },
                                                 [&] { (void)(*plan_f)->Run(in, out_f, ctx_f); }};
  const InterleavedTiming t = MeasureInterleaved(variants, o.repeats, 0.0, 1);
  PlanFigures fu, ff;
  fu.kernels = (*plan_u)->stats().kernels_launched;
  ff.kernels = (*plan_f)->stats().kernels_launched;
  fu.latency_ms = t.timings[0].median_s * 1e3;
  ff.latency_ms = t.timings[1].median_s * 1e3;
  fu.bytes = KernelBytes(unfused);
  ff.bytes = KernelBytes(fused);
  const int profile_runs = std::max(3, o.repeats / 2);
  PlanProfile prof_u, prof_f;
  for (int r = 0; r < profile_runs; ++r) {  // alternating rounds, the order swapped each round
    for (int i = 0; i < 2; ++i) {
      const bool unfused_now = (i == 0) == (r % 2 == 0);
      const Status st = unfused_now ? prof_u.Observe(**plan_u, in, out_u, ctx) : prof_f.Observe(**plan_f, in, out_f, ctx_f);
      if (!st.ok()) return fail(st);
    }
  }
  prof_u.Finish(fu);
  prof_f.Finish(ff);
  // The outside-GEMM ratio of each round (unfused over fused, observed back to back), median.
  std::vector<double> round_ratios;
  for (int r = 0; r < profile_runs; ++r)
    if (prof_f.round_outside_ms()[r] > 0) round_ratios.push_back(prof_u.round_outside_ms()[r] / prof_f.round_outside_ms()[r]);
  std::sort(round_ratios.begin(), round_ratios.end());
  const double outside_round_ratio = round_ratios.empty() ? 0.0 : round_ratios[round_ratios.size() / 2];
  const Timing dispatch = MeasureMedian([&] { pool.Run(pool.num_threads(), [](void*, int, int) {}, nullptr); }, 21);
  const double per_launch_us = dispatch.median_s * 1e6;

  std::printf("graphfuse demo: %s block (%s shapes: hidden %lld, %lld heads, ffn %lld, seq %lld%s, batch %lld), f32%s, "
              "%d thread(s), %s\n",
              FamilyName(cfg).c_str(), cfg.preset.c_str(), static_cast<long long>(cfg.hidden),
              static_cast<long long>(cfg.heads), static_cast<long long>(cfg.ffn), static_cast<long long>(cfg.seq),
              cfg.past > 0 ? StrCat(" after a KV cache of ", cfg.past, " rows").c_str() : "",
              static_cast<long long>(cfg.batch),
              o.dtype == DType::kF32  ? ""
              : o.backend == "cpu"    ? " with bf16 GEMM weights"
                                      : StrCat(" on the CPU, ", DTypeName(o.dtype), " on the GPU").c_str(),
              pool.num_threads(), cpu::SimdTargetName());
  std::printf("\n%-34s %12s %12s %9s\n", "", "unfused", "fused", "ratio");
  auto row = [](const char* what, double a, double b, const char* fmt) {
    char sa[32], sb[32];
    std::snprintf(sa, sizeof sa, fmt, a);
    std::snprintf(sb, sizeof sb, fmt, b);
    std::printf("%-34s %12s %12s %8.2fx\n", what, sa, sb, b > 0 ? a / b : 0.0);
  };
  row("kernels per block", static_cast<double>(fu.kernels), static_cast<double>(ff.kernels), "%.0f");
  row("dispatch overhead, ms (est.)", fu.kernels * per_launch_us / 1e3, ff.kernels * per_launch_us / 1e3, "%.3f");
  row("time outside GEMMs, ms", fu.outside_gemm_ms, ff.outside_gemm_ms, "%.3f");
  row("time in GEMMs, ms", fu.gemm_ms, ff.gemm_ms, "%.3f");
  row("block latency, ms (median)", fu.latency_ms, ff.latency_ms, "%.3f");
  row("bytes moved by kernels, MB", fu.bytes / 1e6, ff.bytes / 1e6, "%.1f");
  std::printf("\nspeedup %.2fx (median of per-round ratios %.2fx over %d interleaved rounds)\n",
              fu.latency_ms / ff.latency_ms, 1 / t.median_ratio_to_first[1], o.repeats);
  std::printf("time outside GEMMs: median of per-round ratios %.2fx over %d rounds that observed the two plans\n"
              "back to back (min %.2fx, max %.2fx)\n",
              outside_round_ratio, profile_runs, round_ratios.empty() ? 0.0 : round_ratios.front(),
              round_ratios.empty() ? 0.0 : round_ratios.back());
  std::printf("dispatch: one %d-thread pool launch costs %.2f us here (same run); the estimate is kernels x that.\n",
              pool.num_threads(), per_launch_us);
  std::printf("GEMM time: MatMul kernels, and inside fused kernels the share of thread-time spent in BLAS calls\n"
              "(their epilogues, softmax and RoPE count as outside, except a residual add or a gate's multiply\n"
              "that the GEMM applies as it stores); kernel times are medians of observed runs.\n");
  if (codegen) std::printf("fused plan: elementwise programs as native loops: %s\n", CodegenSummary(*codegen).c_str());
  std::printf("check: fused vs unfused max |err| %.3g, max rel err %.3g (|err| <= %.0e + %.0e*|ref|)%s: %s\n\n",
              max_abs, max_rel, o.atol, o.rtol, nonfinite.c_str(), ok ? "ok" : "DIFFERS");
  if (o.profile) {
    for (const auto& [label, f] : {std::pair<const char*, const PlanFigures*>{"unfused", &fu}, {"fused", &ff}}) {
      std::printf("%s plan, per kernel (median ms over %d observed runs):\n", label, profile_runs);
      for (const auto& st : f->steps)
        std::printf("  %9.3f  %5.1f%% GEMM  %s\n", st.ms, 100 * st.gemm_share, st.name.c_str());
    }
    std::printf("\n");
  }
#ifdef GF_HAVE_CUDA
  // --backend cuda: both plans on GPU 0, launched one by one and replayed as one CUDA graph;
  // outputs checked against the CPU's unfused f32 result (within --rtol / --atol, or for --dtype
  // bf16 / f16 within that dtype's tolerance unless they are given); latency = median device
  // time (events). --emulate-gpu runs the launched plans on the host (no CUDA graph, no device
  // times: its "device ms" is the host's time of one emulated run).
  struct GpuRow {
    std::string plan;
    bool graph = false;
    int64_t launches = 0, generated = 0, cublas = 0, host = 0, device_bytes = 0, act_bytes = 0, act_no_reuse = 0;
    double ms = 0, wall_ms = 0, max_abs = 0;
    bool ok = false;
  };
  std::vector<GpuRow> gpu_rows;
  const bool narrow = o.dtype != DType::kF32;
  const double gpu_rtol = narrow && !o.rtol_set ? NarrowTolerance(o.dtype) : o.rtol;
  const double gpu_atol = narrow && !o.atol_set ? NarrowTolerance(o.dtype) : o.atol;
  const int gpu_repeats = o.emulate_gpu ? 1 : std::max(3, o.repeats);
  if (o.backend == "cuda") {
    std::fprintf(stderr, o.emulate_gpu ? "  running the CUDA plans emulated on the host...\n"
                                       : "  running on the GPU (compiling kernels with NVRTC)...\n");
    const Graph* gpu_unfused = narrow ? narrow_u.get() : &unfused;
    const Graph* gpu_fused = narrow ? narrow_f.get() : &fused;
    for (const auto& [label, graph] : {std::pair<const char*, const Graph*>{"unfused", gpu_unfused}, {"fused", gpu_fused}}) {
      for (bool use_graph : {false, true}) {
        if (use_graph && o.emulate_gpu) continue;  // a CUDA graph cannot be emulated
        cuda::CudaExecOptions co;
        co.cuda_graph = use_graph;
        co.emulate = o.emulate_gpu;
        auto ex = cuda::CudaExecutor::Create(*graph, co);
        if (!ex.ok()) return fail(ex.status().WithContext(StrCat("--backend cuda, ", label, " plan")));
        auto y = (*ex)->Run(narrow ? std::span<const TensorView>(in_narrow) : in);
        if (!y.ok()) return fail(y.status().WithContext(StrCat("--backend cuda, ", label, " plan")));
        GpuRow r;
        r.plan = StrCat(label, use_graph ? " + CUDA graph" : "");
        r.graph = use_graph;
        int64_t bad_gpu = 0;
        if (y->size() != ys_u.size()) return fail(Internal("--backend cuda, ", label, " plan: ", y->size(), " outputs"));
        for (size_t k = 0; k < ys_u.size(); ++k) {
          const Tensor& yu = ys_u[k];
          for (int64_t i = 0; i < yu.numel(); ++i) {
            const double a = (*y)[k].GetAsDouble(i), b = yu.data_as<float>()[i];
            const double err = std::fabs(a - b);
            r.max_abs = std::isfinite(err) ? std::max(r.max_abs, err) : INFINITY;
            bad_gpu += !(err <= gpu_atol + gpu_rtol * std::fabs(b));
          }
        }
        r.ok = bad_gpu == 0;
        auto median_ms = (*ex)->MedianReplayMs(gpu_repeats, &r.wall_ms);
        if (!median_ms.ok()) return fail(median_ms.status());
        r.ms = *median_ms;
        if (!use_graph) {
          const bool profile = o.profile && !o.emulate_gpu;  // an emulated plan has no device times
          std::printf("GPU 0%s, %s plan%s, step by step%s:\n", o.emulate_gpu ? " (emulated)" : "", label,
                      narrow ? StrCat(" in ", DTypeName(o.dtype)).c_str() : "",
                      profile ? " (median device ms over the replays)" : "");
          std::vector<std::pair<std::string, double>> prof;
          if (profile) {
            auto p = (*ex)->ProfileSteps(gpu_repeats);
            if (!p.ok()) return fail(p.status());
            prof = std::move(*p);
          }
          // describe() has a line per planned node; the profile, a time per step.
          for (const std::string& line : (*ex)->describe()) std::printf("  %s\n", line.c_str());
          for (const auto& [step, ms] : prof) std::printf("  %9.4f  %s\n", ms, step.c_str());
        }
        const cuda::CudaExecStats& cs = (*ex)->stats();
        r.launches = cs.launches, r.generated = cs.generated, r.cublas = cs.cublas, r.host = cs.host_fallbacks;
        r.device_bytes = cs.device_bytes, r.act_bytes = cs.activation_bytes, r.act_no_reuse = cs.activation_bytes_no_reuse;
        gpu_rows.push_back(r);
      }
    }
    std::printf("GPU 0: %-22s %9s %10s %7s %5s %11s %11s %14s\n", "plan", "launches", "generated", "cuBLAS", "host",
                "device ms", "wall ms", "max|err| vs CPU");
    for (const GpuRow& r : gpu_rows)
      std::printf("       %-22s %9lld %10lld %7lld %5lld %11.4f %11.4f %14.3g %s\n", r.plan.c_str(),
                  static_cast<long long>(r.launches), static_cast<long long>(r.generated),
                  static_cast<long long>(r.cublas), static_cast<long long>(r.host), r.ms, r.wall_ms, r.max_abs,
                  r.ok ? "ok" : "DIFFERS");
    for (const GpuRow& r : gpu_rows)
      if (!r.graph)  // the same buffers as the launched plan
        std::printf("       %-22s device memory %.1f MB, of which activations and scratch %.1f MB (%.1f MB without reuse)\n",
                    r.plan.c_str(), r.device_bytes / 1e6, r.act_bytes / 1e6, r.act_no_reuse / 1e6);
    std::printf("(%s; max|err| of every output against the CPU's f32 unfused plan, within %.0e + %.0e*|ref|)\n\n",
                o.emulate_gpu ? "emulated on the host, no GPU used: \"device ms\" is the host's time of one run"
                              : StrCat("medians of ", gpu_repeats,
                                       " replays: device ms between CUDA events around the launches; wall ms on the\n"
                                       " host from the first launch to the end of the wait, as a framework's\n"
                                       " call-then-synchronize timing sees it; launches include cuBLAS calls").c_str(),
                gpu_atol, gpu_rtol);
  }
#endif
  // Each group's node in the fused plan is named after it: its op says what runs
  // (FusedAttention, FusedCachedAttention with a KV cache, FusedGemm, ...).
  std::map<std::string, std::string> fused_ops;
  for (const auto& n : fused.nodes()) fused_ops[n->name()] = n->op();
  std::printf("fused plan: %zu groups (graphfuse explain prints them with every refusal)\n", report.groups.size());
  for (const FusedGroupInfo& g : report.groups) {
    std::string members;
    for (const std::string& n : g.nodes) members += (members.empty() ? "" : ", ") + n;
    const auto op = fused_ops.find(g.name);
    std::printf("  %-16s %-16s %-20s %s\n      %s\n", g.name.c_str(), g.kind.c_str(),
                op == fused_ops.end() ? "" : op->second.c_str(), g.kernel_name.c_str(), members.c_str());
  }
  if (narrow_f) {
    std::string kinds;
    for (const FusedGroupInfo& g : narrow_report.groups) kinds += (kinds.empty() ? "" : ", ") + g.kind;
    std::printf("fused plan in %s (the GPU's): %zu groups: %s\n", DTypeName(o.dtype), narrow_report.groups.size(),
                kinds.c_str());
  }

  if (!o.json.empty()) {
    Json j;
    j.BeginObject().Key("command").Str("demo").Key("preset").Str(cfg.preset);
    j.Key("config").BeginObject().Key("hidden").Int(cfg.hidden).Key("heads").Int(cfg.heads).Key("ffn").Int(cfg.ffn);
    j.Key("seq").Int(cfg.seq).Key("past").Int(cfg.past).Key("batch").Int(cfg.batch).Key("threads").Int(pool.num_threads());
    j.Key("simd").Str(cpu::SimdTargetName()).EndObject();
    // The CPU's plans compute in f32; the GPU's (--backend cuda) in `dtype`.
    j.Key("dtype").Str(DTypeName(o.dtype)).Key("backend").Str(o.backend).Key("emulate_gpu").Bool(o.emulate_gpu);
    AddFusionJson(j, report);
    j.Key("fused_plan_ops").BeginArray();  // the fused plan's nodes in order: {name, op}
    for (const auto& n : fused.nodes()) j.BeginObject().Key("name").Str(n->name()).Key("op").Str(n->op()).EndObject();
    j.EndArray();
    j.Key("outputs").BeginArray();
    for (const OutputCheck& c : output_checks)
      j.BeginObject().Key("name").Str(c.name).Key("max_abs_err").Num(c.max_abs).Key("max_rel_err").Num(c.max_rel)
          .Key("ok").Bool(c.ok && nonfinite_u + nonfinite_f == 0).EndObject();
    j.EndArray();
    j.Key("latency_ms").BeginObject().Key("unfused").Num(fu.latency_ms).Key("fused").Num(ff.latency_ms).EndObject();
    j.Key("outside_gemm_ms").BeginObject().Key("unfused").Num(fu.outside_gemm_ms).Key("fused").Num(ff.outside_gemm_ms);
    j.EndObject();
    j.Key("outside_gemm_round_ratio").BeginObject().Key("median").Num(outside_round_ratio);
    j.Key("min").Num(round_ratios.empty() ? 0.0 : round_ratios.front());
    j.Key("max").Num(round_ratios.empty() ? 0.0 : round_ratios.back()).Key("rounds").Int(profile_runs).EndObject();
    j.Key("gemm_ms").BeginObject().Key("unfused").Num(fu.gemm_ms).Key("fused").Num(ff.gemm_ms).EndObject();
    j.Key("dispatch_us_per_launch").Num(per_launch_us);
    j.Key("bytes_moved").BeginObject().Key("unfused").Num(fu.bytes).Key("fused").Num(ff.bytes).EndObject();
#ifdef GF_HAVE_CUDA
    if (!gpu_rows.empty()) {
      j.Key("cuda_tolerance").BeginObject().Key("rtol").Num(gpu_rtol).Key("atol").Num(gpu_atol).EndObject();
      if (narrow_f) {
        j.Key("cuda_fused_groups").BeginArray();
        for (const FusedGroupInfo& g : narrow_report.groups) j.BeginObject().Key("name").Str(g.name).Key("kind").Str(g.kind).EndObject();
        j.EndArray();
      }
      j.Key("cuda").BeginArray();
      for (const GpuRow& r : gpu_rows)
        j.BeginObject().Key("plan").Str(r.plan).Key("dtype").Str(DTypeName(o.dtype)).Key("launches").Int(r.launches).Key("generated").Int(r.generated)
            .Key("cublas").Int(r.cublas).Key("host").Int(r.host).Key("latency_ms").Num(r.ms).Key("wall_ms").Num(r.wall_ms)
            .Key("device_bytes").Int(r.device_bytes).Key("activation_bytes").Int(r.act_bytes)
            .Key("activation_bytes_no_reuse").Int(r.act_no_reuse)
            .Key("max_abs_err_vs_cpu").Num(r.max_abs).Key("ok").Bool(r.ok).EndObject();
      j.EndArray();
    }
#endif
    j.EndObject();
    if (!j.WriteFile(o.json)) {
      std::fprintf(stderr, "graphfuse demo: cannot write --json file '%s'\n", o.json.c_str());
      return kExitBadInput;
    }
  }
#ifdef GF_HAVE_CUDA
  for (const GpuRow& r : gpu_rows)
    if (!r.ok) return kExitMismatch;
#endif
  return ok ? kExitOk : kExitMismatch;
}

}  // namespace graphfuse::cli
