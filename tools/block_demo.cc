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
#include "graphfuse/profiling.h"
#include "testing/blocks.h"
#include "cpu/executor.h"
#include "testing/timer.h"

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
  TargetOptions target;       // --emulate-gpu: --backend cuda's plans on the host
  DType dtype = DType::kF32;  // what the target's plans compute in (--dtype)
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
      o.target.cuda.emulate = true;
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
    } else if (f == "--cpu-gemm") {
      GF_ASSIGN_OR_RETURN(o.target.cpu.gemm, args.CpuGemm(f));
    } else if (f == "--backend") {
      GF_ASSIGN_OR_RETURN(o.backend, args.Backend(f));
    } else {
      return InvalidArgument("demo: unknown flag '", f,
                             "' (flags: --preset NAME --seq N --past L --threads T --repeats R --rtol R --atol A "
                             "--profile --cpu-codegen --cpu-gemm auto|rule|own|onednn --backend cpu|cuda --emulate-gpu "
                             "--dtype f32|bf16|f16 --json FILE)");
    }
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
      const bool gemm_op = n.is(op::MatMul) || n.is(op::Gemm);
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


// Fused against unfused, every output (y, and the present rows with a cache), one figure over
// all; NaN / inf make no error figure, so they are counted instead.
struct OutputCheck {
  std::string name;
  double max_abs = 0, max_rel = 0;
  bool ok = true;
};

struct DemoCheck {
  std::vector<OutputCheck> outputs;
  double max_abs = 0, max_rel = 0;
  int64_t bad = 0, nonfinite_u = 0, nonfinite_f = 0, compared = 0;
  bool ok() const { return bad == 0 && nonfinite_u == 0 && nonfinite_f == 0; }
  std::string nonfinite() const {
    return nonfinite_u + nonfinite_f == 0
               ? std::string()
               : StrCat("; NaN or inf values: ", nonfinite_f, " fused, ", nonfinite_u, " unfused, of ", compared);
  }
};

DemoCheck CheckFusedAgainstUnfused(const Graph& unfused, const std::vector<Tensor>& ys_u,
                                   const std::vector<Tensor>& ys_f, double rtol, double atol) {
  DemoCheck d;
  for (size_t k = 0; k < ys_u.size(); ++k) {
    const Tensor &yu = ys_u[k], &yf = ys_f[k];
    OutputCheck c{unfused.outputs()[k]->name()};
    d.compared += yu.numel();
    for (int64_t i = 0; i < yu.numel(); ++i) {
      const double a = yf.data_as<float>()[i], b = yu.data_as<float>()[i];
      d.nonfinite_f += !std::isfinite(a);
      d.nonfinite_u += !std::isfinite(b);
      const double err = std::fabs(a - b);
      c.max_abs = std::max(c.max_abs, err);
      c.max_rel = std::max(c.max_rel, err / std::max(std::fabs(b), 1e-30));
      const bool bad_here = !(err <= atol + rtol * std::fabs(b));
      d.bad += bad_here;
      c.ok &= !bad_here;
    }
    d.max_abs = std::max(d.max_abs, c.max_abs), d.max_rel = std::max(d.max_rel, c.max_rel);
    d.outputs.push_back(c);
  }
  return d;
}

// A target other than the reference (--backend cuda): both plans on it (device 0), run one by
// one and replayed as one CUDA graph; outputs checked against the CPU's unfused f32 result
// (within --rtol / --atol, or for --dtype bf16 / f16 within that dtype's tolerance unless they
// are given); latency = median device time (events). --emulate-gpu runs the launched plans on
// the host (no CUDA graph, no device times: its "device ms" is the host's time of one run).
struct GpuRow {
  std::string plan;
  bool graph = false;
  ExecutableStats stats;
  double ms = 0, wall_ms = 0, max_abs = 0;
  bool ok = false;
};

// What the target's runs take from the demo: its flags, tolerances and repeats, the inputs in
// f32 and in --dtype, and the CPU's unfused outputs they are checked against.
struct DemoGpu {
  const BlockDemoOptions& o;
  double rtol, atol;
  int repeats;
  std::span<const TensorView> in, in_narrow;
  const std::vector<Tensor>& ys_u;
};

Status RunDemoOnTarget(const DemoGpu& d, const Target& target, const Graph& gpu_unfused, const Graph& gpu_fused,
                       std::vector<GpuRow>* rows) {
  const BlockDemoOptions& o = d.o;
  const bool emulate_gpu = o.target.cuda.emulate, narrow = o.dtype != DType::kF32;
  const int device = o.target.cuda.device;
  const double gpu_rtol = d.rtol, gpu_atol = d.atol;
  const std::span<const TensorView> in = narrow ? d.in_narrow : d.in;
  const std::vector<Tensor>& ys_u = d.ys_u;
  std::vector<GpuRow>& gpu_rows = *rows;
  std::fprintf(stderr, emulate_gpu ? "  running the %s plans emulated on the host...\n"
                                   : "  running on the %s target (compiling its kernels)...\n",
               o.backend.c_str());
  // The same target replaying each run as one CUDA graph (none when emulated).
  std::shared_ptr<const Target> replayed;
  if (!emulate_gpu) {
    TargetOptions graph_options = o.target;
    graph_options.cuda.graph = true;
    auto t = MakeCommandTarget(o.backend, graph_options, o.dtype);
    if (t.ok()) replayed = *t;
  }
  for (const auto& [label, graph] :
       {std::pair<const char*, const Graph*>{"unfused", &gpu_unfused}, {"fused", &gpu_fused}}) {
    // The planned graph outlives its executables (they share it without owning it).
    const std::shared_ptr<const Graph> shared(graph, [](const Graph*) {});
    for (bool use_graph : {false, true}) {
      if (use_graph && !replayed) continue;
      const std::string where = StrCat("--backend ", o.backend, ", ", label, " plan");
      auto ex = (use_graph ? *replayed : target).Compile(shared);
      if (!ex.ok()) return ex.status().WithContext(where);
      std::vector<Tensor> y;
      std::vector<TensorView> y_views;
      for (const Value* v : graph->outputs()) {
        y.push_back(Tensor::Empty(v->dtype(), v->shape()).value());
        y_views.push_back(y.back().view());
      }
      if (y.size() != ys_u.size()) return Internal(where, ": ", y.size(), " outputs");
      if (Status st = (*ex)->Run(in, y_views); !st.ok())
        return st.WithContext(where);
      GpuRow r;
      r.plan = StrCat(label, use_graph ? " + CUDA graph" : "");
      r.graph = use_graph;
      int64_t bad_gpu = 0;
      for (size_t k = 0; k < ys_u.size(); ++k) {
        const Tensor& yu = ys_u[k];
        for (int64_t i = 0; i < yu.numel(); ++i) {
          const double a = y[k].GetAsDouble(i), b = yu.data_as<float>()[i];
          const double err = std::fabs(a - b);
          r.max_abs = std::isfinite(err) ? std::max(r.max_abs, err) : INFINITY;
          bad_gpu += !(err <= gpu_atol + gpu_rtol * std::fabs(b));
        }
      }
      r.ok = bad_gpu == 0;
      auto median_ms = (*ex)->DeviceRunMs(d.repeats, &r.wall_ms);
      if (!median_ms.ok()) return median_ms.status();
      r.ms = *median_ms;
      if (!use_graph) {
        const bool profile = o.profile && !emulate_gpu;  // an emulated plan has no device times
        std::printf("GPU %d%s, %s plan%s, step by step%s:\n", device, emulate_gpu ? " (emulated)" : "", label,
                    narrow ? StrCat(" in ", DTypeName(o.dtype)).c_str() : "",
                    profile ? " (device ms of a replay, step by step)" : "");
        // Describe(): a summary, then a line per planned node; the profile, a time per step.
        const std::vector<std::string> lines = (*ex)->Describe();
        for (size_t i = 1; i < lines.size(); ++i) std::printf("%s\n", lines[i].c_str());
        if (profile) {
          StepLog log;
          if (Status st = (*ex)->RunProfiled(in, y_views, log); !st.ok()) return st.WithContext(where);
          for (const StepTiming& step : log.steps)
            std::printf("  %9.4f  %s\n", step.duration_ns * 1e-6, step.label.c_str());
        }
      }
      r.stats = (*ex)->stats();
      gpu_rows.push_back(r);
    }
  }
  std::printf("GPU %d: %-22s %9s %10s %7s %5s %11s %11s %14s\n", device, "plan", "launches", "generated", "cuBLAS",
              "host", "device ms", "wall ms", "max|err| vs CPU");
  for (const GpuRow& r : gpu_rows)
    std::printf("       %-22s %9lld %10lld %7lld %5lld %11.4f %11.4f %14.3g %s\n", r.plan.c_str(),
                static_cast<long long>(r.stats.launches), static_cast<long long>(r.stats.generated),
                static_cast<long long>(r.stats.library_calls), static_cast<long long>(r.stats.host_steps), r.ms,
                r.wall_ms, r.max_abs, r.ok ? "ok" : "DIFFERS");
  for (const GpuRow& r : gpu_rows)
    if (!r.graph)  // the same buffers as the launched plan
      std::printf("       %-22s device memory %.1f MB, of which activations and scratch %.1f MB (%.1f MB without reuse)\n",
                  r.plan.c_str(), r.stats.device_bytes / 1e6, r.stats.activation_bytes / 1e6,
                  r.stats.activation_bytes_no_reuse / 1e6);
  std::printf("(%s; max|err| of every output against the CPU's f32 unfused plan, within %.0e + %.0e*|ref|)\n\n",
              emulate_gpu ? "emulated on the host, no GPU used: \"device ms\" is the host's time of one run"
                          : StrCat("medians of ", d.repeats,
                                   " replays: device ms between CUDA events around the launches; wall ms on the\n"
                                   " host from the first launch to the end of the wait, as a framework's\n"
                                   " call-then-synchronize timing sees it; launches include cuBLAS calls").c_str(),
              gpu_atol, gpu_rtol);
  return Status::Ok();
}


// Everything the demo's table and --json report of the host's two plans.
struct DemoReport {
  const BlockConfig& cfg;
  int threads;
  const FusionReport& report;
  const Graph& fused;
  const DemoCheck& check;
  const PlanFigures &fu, &ff;
  const InterleavedTiming& timing;
  const std::vector<double>& round_ratios;  // outside-GEMM, unfused over fused, sorted
  int profile_runs;
  double per_launch_us;
  double outside_round_ratio() const { return round_ratios.empty() ? 0.0 : round_ratios[round_ratios.size() / 2]; }
};

void PrintDemoTable(const BlockDemoOptions& o, const DemoReport& r, bool on_reference, const CpuCodegen* codegen) {
  const BlockConfig& cfg = r.cfg;
  const PlanFigures &fu = r.fu, &ff = r.ff;
  const DemoCheck& check = r.check;
  const std::vector<double>& round_ratios = r.round_ratios;
  const int profile_runs = r.profile_runs;
  const double per_launch_us = r.per_launch_us;
  std::printf("graphfuse demo: %s block (%s shapes: hidden %lld, %lld heads, ffn %lld, seq %lld%s, batch %lld), f32%s, "
              "%d thread(s), %s\n",
              FamilyName(cfg).c_str(), cfg.preset.c_str(), static_cast<long long>(cfg.hidden),
              static_cast<long long>(cfg.heads), static_cast<long long>(cfg.ffn), static_cast<long long>(cfg.seq),
              cfg.past > 0 ? StrCat(" after a KV cache of ", cfg.past, " rows").c_str() : "",
              static_cast<long long>(cfg.batch),
              o.dtype == DType::kF32 ? ""
              : on_reference         ? " with bf16 GEMM weights"
                                     : StrCat(" on the CPU, ", DTypeName(o.dtype), " on the GPU").c_str(),
              r.threads, cpu::SimdTargetName());
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
              fu.latency_ms / ff.latency_ms, 1 / r.timing.median_ratio_to_first[1], o.repeats);
  std::printf("time outside GEMMs: median of per-round ratios %.2fx over %d rounds that observed the two plans\n"
              "back to back (min %.2fx, max %.2fx)\n",
              r.outside_round_ratio(), profile_runs, round_ratios.empty() ? 0.0 : round_ratios.front(),
              round_ratios.empty() ? 0.0 : round_ratios.back());
  std::printf("dispatch: one %d-thread pool launch costs %.2f us here (same run); the estimate is kernels x that.\n",
              r.threads, per_launch_us);
  std::printf("GEMM time: MatMul kernels, and inside fused kernels the share of thread-time spent in BLAS calls\n"
              "(their epilogues, softmax and RoPE count as outside, except a residual add or a gate's multiply\n"
              "that the GEMM applies as it stores); kernel times are medians of observed runs.\n");
  if (codegen) std::printf("fused plan: elementwise programs as native loops: %s\n", codegen->Summary().c_str());
  std::printf("check: fused vs unfused max |err| %.3g, max rel err %.3g (|err| <= %.0e + %.0e*|ref|)%s: %s\n\n",
              check.max_abs, check.max_rel, o.atol, o.rtol, check.nonfinite().c_str(), check.ok() ? "ok" : "DIFFERS");
  if (o.profile) {
    for (const auto& [label, f] : {std::pair<const char*, const PlanFigures*>{"unfused", &fu}, {"fused", &ff}}) {
      std::printf("%s plan, per kernel (median ms over %d observed runs):\n", label, profile_runs);
      for (const auto& st : f->steps)
        std::printf("  %9.3f  %5.1f%% GEMM  %s\n", st.ms, 100 * st.gemm_share, st.name.c_str());
    }
    std::printf("\n");
  }
}

// The fused plan's groups, and the kinds of the target's fused plan when there is one.
void PrintFusedGroups(const BlockDemoOptions& o, const Graph& fused, const FusionReport& report,
                      const FusionReport* target_report) {
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
  if (target_report) {
    std::string kinds;
    for (const FusedGroupInfo& g : target_report->groups) kinds += (kinds.empty() ? "" : ", ") + g.kind;
    std::printf("fused plan in %s (the %s target's): %zu groups: %s\n", DTypeName(o.dtype), o.backend.c_str(),
                target_report->groups.size(), kinds.c_str());
  }
}

bool WriteDemoJson(const BlockDemoOptions& o, const DemoReport& r, const std::vector<GpuRow>& gpu_rows,
                   double gpu_rtol, double gpu_atol, const FusionReport* target_report) {
  const BlockConfig& cfg = r.cfg;
  const PlanFigures &fu = r.fu, &ff = r.ff;
  Json j;
  j.BeginObject().Key("command").Str("demo").Key("preset").Str(cfg.preset);
  j.Key("config").BeginObject().Key("hidden").Int(cfg.hidden).Key("heads").Int(cfg.heads).Key("ffn").Int(cfg.ffn);
  j.Key("seq").Int(cfg.seq).Key("past").Int(cfg.past).Key("batch").Int(cfg.batch).Key("threads").Int(r.threads);
  j.Key("simd").Str(cpu::SimdTargetName()).EndObject();
  // The CPU's plans compute in f32; the GPU's (--backend cuda) in `dtype`.
  j.Key("dtype").Str(DTypeName(o.dtype)).Key("backend").Str(o.backend).Key("emulate_gpu").Bool(o.target.cuda.emulate);
  AddFusionJson(j, r.report);
  j.Key("fused_plan_ops").BeginArray();  // the fused plan's nodes in order: {name, op}
  for (const auto& n : r.fused.nodes()) j.BeginObject().Key("name").Str(n->name()).Key("op").Str(n->op()).EndObject();
  j.EndArray();
  j.Key("outputs").BeginArray();
  for (const OutputCheck& c : r.check.outputs)
    j.BeginObject().Key("name").Str(c.name).Key("max_abs_err").Num(c.max_abs).Key("max_rel_err").Num(c.max_rel)
        .Key("ok").Bool(c.ok && r.check.nonfinite_u + r.check.nonfinite_f == 0).EndObject();
  j.EndArray();
  j.Key("latency_ms").BeginObject().Key("unfused").Num(fu.latency_ms).Key("fused").Num(ff.latency_ms).EndObject();
  j.Key("outside_gemm_ms").BeginObject().Key("unfused").Num(fu.outside_gemm_ms).Key("fused").Num(ff.outside_gemm_ms);
  j.EndObject();
  j.Key("outside_gemm_round_ratio").BeginObject().Key("median").Num(r.outside_round_ratio());
  j.Key("min").Num(r.round_ratios.empty() ? 0.0 : r.round_ratios.front());
  j.Key("max").Num(r.round_ratios.empty() ? 0.0 : r.round_ratios.back()).Key("rounds").Int(r.profile_runs).EndObject();
  j.Key("gemm_ms").BeginObject().Key("unfused").Num(fu.gemm_ms).Key("fused").Num(ff.gemm_ms).EndObject();
  j.Key("dispatch_us_per_launch").Num(r.per_launch_us);
  j.Key("bytes_moved").BeginObject().Key("unfused").Num(fu.bytes).Key("fused").Num(ff.bytes).EndObject();
  if (!gpu_rows.empty()) {  // the target's figures, under its name
    j.Key(o.backend + "_tolerance").BeginObject().Key("rtol").Num(gpu_rtol).Key("atol").Num(gpu_atol).EndObject();
    if (target_report) {
      j.Key(o.backend + "_fused_groups").BeginArray();
      for (const FusedGroupInfo& g : target_report->groups) j.BeginObject().Key("name").Str(g.name).Key("kind").Str(g.kind).EndObject();
      j.EndArray();
    }
    j.Key(o.backend).BeginArray();
    for (const GpuRow& row : gpu_rows)
      j.BeginObject().Key("plan").Str(row.plan).Key("dtype").Str(DTypeName(o.dtype)).Key("launches").Int(row.stats.launches)
          .Key("generated").Int(row.stats.generated).Key("cublas").Int(row.stats.library_calls)
          .Key("host").Int(row.stats.host_steps).Key("latency_ms").Num(row.ms).Key("wall_ms").Num(row.wall_ms)
          .Key("device_bytes").Int(row.stats.device_bytes).Key("activation_bytes").Int(row.stats.activation_bytes)
          .Key("activation_bytes_no_reuse").Int(row.stats.activation_bytes_no_reuse)
          .Key("max_abs_err_vs_cpu").Num(row.max_abs).Key("ok").Bool(row.ok).EndObject();
    j.EndArray();
  }
  j.EndObject();
  return j.WriteFile(o.json);
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
  BlockDemoOptions o = *parsed;
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "graphfuse demo: %s\n", s.ToString().c_str());
    return kExitBadInput;
  };
  auto preset = BlockPreset(o.preset);
  if (!preset.ok()) return fail(preset.status().WithContext("--preset (or 'elementwise' for the op library)"));
  BlockConfig cfg = *preset;
  if (o.seq > 0) cfg.seq = o.seq;
  cfg.past = o.past;
  auto target = MakeCommandTarget(o.backend, o.target, o.dtype);
  if (!target.ok()) return FailUsage("demo", target.status());
  // The plans timed kernel by kernel on the host: the target's when it is the reference's kind
  // (the CPU), else the reference's, with the target's plans run beside them.
  const bool on_reference = IsReferenceKind(**target);
  const bool emulate_gpu = o.target.cuda.emulate;
  const std::shared_ptr<const Target> host =
      on_reference ? *target : std::shared_ptr<const Target>(MakeReferenceTarget(o.target));
  // bf16 GEMM weights on the CPU: the fused plan rounds weights its folds scaled (an RMSNorm's
  // scale folded into the next GEMM), the unfused plan the weights as written, so the two agree
  // within bf16's tolerance, not f32's.
  if (on_reference && o.dtype == DType::kBF16) {
    if (!o.rtol_set) o.rtol = NarrowTolerance(DType::kBF16);
    if (!o.atol_set) o.atol = NarrowTolerance(DType::kBF16);
  }

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
  // A target other than the reference plans the block for itself. With --dtype bf16 / f16 it
  // runs both plans of the block converted to that dtype (before the passes), checked against
  // the CPU's f32 unfused plan; their inputs and outputs (x, y and the KV cache) are in that
  // dtype too, as a serving stack holds them: no casts at the edges.
  std::unique_ptr<Graph> target_u, target_f;
  if (!on_reference) {
    for (std::unique_ptr<Graph>* dst : {&target_u, &target_f}) {
      auto g = std::make_unique<Graph>(dst == &target_u ? "unfused" : "fused");
      if (Status st = BuildBlock(*g, cfg, *weights); !st.ok()) return fail(st);
      if ((*target)->graph_dtype() != DType::kF32) {
        auto converted = ConvertPrecision(*g, (*target)->graph_dtype(), {.narrow_io = true});
        if (!converted.ok()) return fail(converted.status().WithContext(StrCat("--dtype ", DTypeName(o.dtype))));
        g = std::move(*converted);
      }
      *dst = std::move(g);
    }
  }
  FusionReport report, target_report;
  PipelineOptions off, on;
  off.fusion.enabled = false;
  on.fusion_report = &report;
  std::fprintf(stderr, "  planning (fusion passes)...\n");
  if (auto r = RunPipeline(unfused, *host, off); !r.ok()) return fail(r.status());
  if (auto r = RunPipeline(fused, *host, on); !r.ok()) return fail(r.status());
  if (target_u) {
    PipelineOptions target_on;
    target_on.fusion_report = &target_report;
    const std::string where = StrCat("--backend ", o.backend, " --dtype ", DTypeName(o.dtype));
    if (auto r = RunPipeline(*target_u, **target, off); !r.ok()) return fail(r.status().WithContext(where));
    if (auto r = RunPipeline(*target_f, **target, target_on); !r.ok()) return fail(r.status().WithContext(where));
  }
  // --dtype bf16 on the CPU: both plans hold their GEMMs' weights in bf16.
  const PrepareOptions cpu_prepare{.bf16_weights = on_reference && o.dtype == DType::kBF16,
                                   .gemm_engine = o.target.cpu.gemm,
                                   .threads = o.threads};
  auto plan_u = ExecutionPlan::Compile(unfused, cpu_prepare);
  if (!plan_u.ok()) return fail(plan_u.status());
  auto plan_f = ExecutionPlan::Compile(fused, cpu_prepare);
  if (!plan_f.ok()) return fail(plan_f.status());
  if (const int64_t timed = (*plan_u)->stats().gemm_classes_timed + (*plan_f)->stats().gemm_classes_timed; timed > 0)
    std::fprintf(stderr, "  timed the CPU's GEMM engines for %lld shape classes in %.0f ms (once per machine: cached)\n",
                 static_cast<long long>(timed),
                 (*plan_u)->stats().gemm_tuning_ms + (*plan_f)->stats().gemm_tuning_ms);
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
  const DemoCheck check = CheckFusedAgainstUnfused(unfused, ys_u, ys_f, o.rtol, o.atol);

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
  const Timing dispatch = MeasureMedian([&] { pool.Run(pool.num_threads(), [](void*, int, int) {}, nullptr); }, 21);
  const double per_launch_us = dispatch.median_s * 1e6;

  const DemoReport rep{cfg, pool.num_threads(), report, fused, check, fu, ff, t, round_ratios, profile_runs,
                       per_launch_us};
  PrintDemoTable(o, rep, on_reference, codegen.get());
  std::vector<GpuRow> gpu_rows;
  const bool narrow = o.dtype != DType::kF32;
  const double gpu_rtol = narrow && !o.rtol_set ? NarrowTolerance(o.dtype) : o.rtol;
  const double gpu_atol = narrow && !o.atol_set ? NarrowTolerance(o.dtype) : o.atol;
  const int gpu_repeats = emulate_gpu ? 1 : std::max(3, o.repeats);
  if (!on_reference) {
    const DemoGpu gpu{o, gpu_rtol, gpu_atol, gpu_repeats, in, in_narrow, ys_u};
    if (Status st = RunDemoOnTarget(gpu, **target, *target_u, *target_f, &gpu_rows); !st.ok()) return fail(st);
  }
  PrintFusedGroups(o, fused, report, target_f ? &target_report : nullptr);
  if (!o.json.empty() &&
      !WriteDemoJson(o, rep, gpu_rows, gpu_rtol, gpu_atol, target_f ? &target_report : nullptr)) {
    std::fprintf(stderr, "graphfuse demo: cannot write --json file '%s'\n", o.json.c_str());
    return kExitBadInput;
  }
  for (const GpuRow& r : gpu_rows)
    if (!r.ok) return kExitMismatch;
  return check.ok() ? kExitOk : kExitMismatch;
}

}  // namespace graphfuse::cli
