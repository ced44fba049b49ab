// `graphfuse bench (MODEL.onnx | --preset NAME)`: unfused vs fused, median of interleaved
// repeats; the elementwise presets also report GB/s beside a same-run STREAM triad.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cli_common.h"
#include "compare.h"
#include "fusion_report.h"
#include "graphfuse/cpu.h"
#include "graphfuse/cpu_codegen.h"
#include "ir/text.h"
#include "core/json.h"
#include "graphfuse/profiling.h"
#include "onnx/import.h"
#include "passes/convert_precision.h"
#include "passes/pipeline.h"
#include "runtime/signature.h"
#include "cpu/executor.h"
#include "testing/blocks.h"
#include "testing/presets.h"
#include "testing/reference_eval.h"
#include "testing/timer.h"

namespace graphfuse::cli {
namespace {

int Fail(const Status& s) { return FailUsage("bench", s); }

int64_t IoBytes(const Graph& g) {
  int64_t b = 0;
  for (const Value* v : g.inputs()) b += v->numel() * static_cast<int64_t>(DTypeSize(v->dtype()));
  for (const Value* v : g.outputs()) b += v->numel() * static_cast<int64_t>(DTypeSize(v->dtype()));
  return b;
}


// The flags of a bench of a model or an elementwise preset (the block presets are RunDemo's).
struct BenchFlags {
  std::string model, preset, json, trace_file, backend = "cpu", generate;
  int64_t elements = 1 << 20;
  int threads = 0, repeats = 21;
  double rtol = kDefaultRtol, atol = kDefaultAtol;
  bool native = false, rtol_set = false, atol_set = false, repeats_set = false;
  DType dtype = DType::kF32;     // what the target's plans compute in (--dtype)
  TargetOptions target_options;  // --emulate-gpu, --cpu-gemm
  FusionOptions fusion;
  std::map<std::string, Shape> shapes;
};

Status ParseBenchFlags(Args& args, BenchFlags* b) {
  while (!args.Done()) {
    const std::string f = args.Next();
    if (f == "--shape") {
      GF_ASSIGN_OR_RETURN(const std::string v, args.Value(f));
      GF_RETURN_IF_ERROR(ParseShapeFlag(v, &b->shapes));
    } else if (f == "--cpu-codegen") {
      b->native = true;
    } else if (f == "--cpu-gemm") {
      GF_ASSIGN_OR_RETURN(b->target_options.cpu.gemm, args.CpuGemm(f));
    } else if (f == "--emulate-gpu") {
      b->target_options.cuda.emulate = true;
    } else if (f == "--dtype") {
      GF_ASSIGN_OR_RETURN(b->dtype, args.Dtype(f));
    } else if (f == "--backend") {
      GF_ASSIGN_OR_RETURN(b->backend, args.Backend(f));
    } else if (f == "--generate") {
      GF_ASSIGN_OR_RETURN(b->generate, args.Value(f));
    } else if (f == "--trace") {
      GF_ASSIGN_OR_RETURN(b->trace_file, args.OutputFile(f));
    } else if (f == "--preset") {
      GF_ASSIGN_OR_RETURN(b->preset, args.Value(f));
    } else if (f == "--json") {
      GF_ASSIGN_OR_RETURN(b->json, args.OutputFile(f));
    } else if (f == "--elements") {
      GF_ASSIGN_OR_RETURN(b->elements, args.Int(f, 1, int64_t{1} << 30));
    } else if (f == "--rtol" || f == "--atol") {
      GF_ASSIGN_OR_RETURN(const double v, args.Float(f, 0, 1e6));
      (f == "--rtol" ? b->rtol : b->atol) = v;
      (f == "--rtol" ? b->rtol_set : b->atol_set) = true;
    } else if (f == "--threads" || f == "--repeats") {
      GF_ASSIGN_OR_RETURN(const int64_t v, args.Int(f, 1, f == "--threads" ? 256 : 1001));
      (f == "--threads" ? b->threads : b->repeats) = static_cast<int>(v);
      b->repeats_set |= f == "--repeats";
    } else if (auto flag = ParseFusionFlag(f, args, &b->fusion); !flag.ok()) {
      return flag.status();
    } else if (*flag) {
      // consumed
    } else if (!f.empty() && f[0] == '-') {
      return InvalidArgument("unknown flag '", f, "' (see graphfuse --help)");
    } else if (b->model.empty()) {
      b->model = f;
    } else {
      return InvalidArgument("unexpected argument '", f, "'");
    }
  }
  if (!b->shapes.empty() && b->model.empty()) return InvalidArgument("--shape binds a model's input dims; give a model");
  if (b->model.empty() == b->preset.empty())
    return InvalidArgument("give a model or --preset NAME (chain, gelu, silu, residual; blocks: llama7b, llama-small, "
                           "gpt2, bert), not both");
  return Status::Ok();
}

// Random inputs for a graph's inputs: floats uniform in [-2, 2); integers 0 or 1 (valid token
// ids, attention masks, token types and positions).
Result<std::vector<Tensor>> RandomInputs(const Graph& g, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(-2, 2);
  std::vector<Tensor> ins;
  for (const Value* v : g.inputs()) {
    GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(v->dtype(), v->shape()));
    for (int64_t i = 0; i < t.numel(); ++i) t.SetFromDouble(i, IsFloat(v->dtype()) ? u(rng) : double(rng() % 2));
    ins.push_back(std::move(t));
  }
  return ins;
}

// Output tensors for a graph's outputs, and views of them.
struct Outputs {
  std::vector<Tensor> tensors;
  std::vector<TensorView> views;
  explicit Outputs(const Graph& g) {
    for (const Value* v : g.outputs()) tensors.push_back(Tensor::Empty(v->dtype(), v->shape()).value());
    for (const Tensor& t : tensors) views.push_back(t.view());
  }
};

// --trace: runs of a plan with every kernel timed, recorded as graphfuse/profiling.h places them.
class BenchTrace {
 public:
  explicit BenchTrace(std::string target) : target_(std::move(target)) {}
  Status Record(const Graph& g, const FusionReport* r, const std::vector<KernelChoice>& choices,
                const std::string& what, int64_t kernels, const std::function<Status(StepLog&)>& run) {
    for (int k = 0; k < 3; ++k) {
      StepLog log;
      TracedRun tr;
      tr.graph = &g;
      tr.report = r;
      tr.kernel_choices = &choices;
      tr.signature = what;
      tr.target = target_;
      tr.kernels = kernels;
      tr.start_ns = tr.run_start_ns = SteadyClockNs();
      GF_RETURN_IF_ERROR(run(log));
      tr.end_ns = SteadyClockNs();
      tr.steps = &log.steps;
      trace_.Record(tr);
    }
    return Status::Ok();
  }
  const TraceRecorder& recorder() const { return trace_; }

 private:
  std::string target_;
  TraceRecorder trace_;
};

// The figures of a target other than the reference (--backend cuda).
struct TargetFigures {
  double unfused_ms = 0, fused_ms = 0, copy_gbps = 0, rtol = 0, atol = 0;
};

// What the target section needs of the host's run: how to load the graph, the two pipelines,
// the inputs and the reference's outputs (unfused, fused), and the bytes a run moves.
struct HostRun {
  const std::function<Result<std::unique_ptr<Graph>>()>& load;
  const PipelineOptions& off;
  const PipelineOptions& on;
  const Graph& base;
  const std::vector<TensorView>& inputs;
  const std::vector<Tensor>* want[2];
  double bytes;
};

// A target other than the reference: both plans on it (device 0), checked against the
// reference's outputs, median device time of `repeats` replays each, beside a same-run copy in
// its memory. --dtype bf16 / f16: its plans are of the model converted to that dtype before the
// passes (as `run` converts it), checked against the reference's f32 plans within that dtype's
// tolerance unless --rtol / --atol are given. --emulate-gpu: the plans on the host (the times are
// the host's, of one run, and there is no copy to compare with). Returns the exit code; kExitOk
// goes on.
int BenchOnTarget(const BenchFlags& b, const Target& target, const HostRun& host, BenchTrace* trace,
                  TargetFigures* fig) {
  const bool emulate_gpu = b.target_options.cuda.emulate;
  fig->rtol = b.dtype != DType::kF32 && !b.rtol_set ? NarrowTolerance(b.dtype) : b.rtol;
  fig->atol = b.dtype != DType::kF32 && !b.atol_set ? NarrowTolerance(b.dtype) : b.atol;
  double ms[2] = {0, 0};
  const std::string on_target = StrCat("--backend ", b.backend);
  for (int k = 0; k < 2; ++k) {
    auto src = host.load();
    if (!src.ok()) return Fail(src.status());
    std::shared_ptr<Graph> g = std::move(*src);
    if (target.graph_dtype() != DType::kF32) {
      auto converted = ConvertPrecision(*g, target.graph_dtype());
      if (!converted.ok()) return Fail(converted.status().WithContext(StrCat("--dtype ", DTypeName(b.dtype))));
      g = std::move(*converted);
    }
    PipelineOptions planned = k == 0 ? host.off : host.on;
    planned.fusion_report = nullptr;  // the report is the reference's plan's
    if (auto r = RunPipeline(*g, target, planned); !r.ok()) return Fail(r.status().WithContext(on_target));
    auto ex = target.Compile(g);
    if (!ex.ok()) return Fail(ex.status().WithContext(on_target));
    Outputs got(*g);
    if (Status st = (*ex)->Run(host.inputs, got.views); !st.ok()) return Fail(st.WithContext(on_target));
    for (size_t o = 0; o < got.tensors.size(); ++o) {
      const OutputReport c =
          Compare(host.base.outputs()[o]->name(), got.tensors[o], (*host.want[k])[o], fig->rtol, fig->atol);
      if (!c.ok) {
        std::fprintf(stderr, "graphfuse bench: the %s target's output '%s' differs from the reference's: max |err| "
                     "%.3g, max rel %.3g, %lld mismatches\n", b.backend.c_str(),
                     c.name.c_str(), c.max_abs, c.max_rel, static_cast<long long>(c.mismatches));
        return kExitMismatch;
      }
    }
    auto median_ms = (*ex)->DeviceRunMs(emulate_gpu ? 1 : b.repeats);
    if (!median_ms.ok() && median_ms.status().code() == StatusCode::kUnimplemented)  // a host target: time Run
      median_ms = MeasureMedian([&] { (void)(*ex)->Run(host.inputs, got.views); }, b.repeats).median_s * 1e3;
    if (!median_ms.ok()) return Fail(median_ms.status());
    ms[k] = *median_ms;
    if (!b.trace_file.empty() && !emulate_gpu) {
      // Device times of each step (CUDA events around it), as graphfuse/profiling.h places them.
      const std::vector<KernelChoice> none;
      Status st = trace->Record(*g, nullptr, none, StrCat(b.backend, " plan, ", k == 0 ? "unfused" : "fused"),
                                (*ex)->launches_per_run(),
                                [&](StepLog& log) -> Status { return (*ex)->RunProfiled(host.inputs, got.views, log); });
      if (!st.ok()) return Fail(st);
    }
  }
  fig->unfused_ms = ms[0], fig->fused_ms = ms[1];
  const std::string agree = b.dtype == DType::kF32 ? "outputs == CPU's"
                                                   : StrCat("in ", DTypeName(b.dtype), ", outputs within ", fig->atol,
                                                            " + ", fig->rtol, " * |CPU's f32|");
  auto copy_gbps = target.CopyGbps(b.elements * 4, b.repeats);
  if (!copy_gbps.ok()) {
    std::printf("  %s plans emulated on the host (no GPU used): unfused %.1f ms, fused %.1f ms (host time of one run); %s\n",
                b.backend.c_str(), fig->unfused_ms, fig->fused_ms, agree.c_str());
  } else {
    fig->copy_gbps = *copy_gbps;
    const double bytes = host.bytes;
    std::printf("  GPU %d: unfused %.4f ms (%.1f GB/s), fused %.4f ms (%.1f GB/s; %.0f%% of copy), "
                "device copy %.1f GB/s (read + write); %s\n",
                b.target_options.cuda.device, fig->unfused_ms, bytes / (fig->unfused_ms * 1e-3) / 1e9,
                fig->fused_ms, bytes / (fig->fused_ms * 1e-3) / 1e9,
                100 * bytes / (fig->fused_ms * 1e-3) / 1e9 / fig->copy_gbps, fig->copy_gbps, agree.c_str());
  }
  return kExitOk;
}

// The host's figures, as the table and --json report them.
struct HostFigures {
  const ElementwisePreset* preset;  // null for a model
  int threads;
  double planning_ms, rtol, atol;
  double tuning_ms;  // timing the GEMM engines, both plans (once per machine: 0 when cached)
  const std::vector<OutputReport>* checks;
  const InterleavedTiming* timing;
  double t_unfused, t_fused, t_native;  // seconds; t_native 0 without --cpu-codegen
  double bytes, gb_triad, max_rel_f64;
};

bool WriteBenchJson(const BenchFlags& b, const FusionReport& report, const HostFigures& h,
                    const TargetFigures* target) {
  const ElementwisePreset* p = h.preset;
  Json j;
  j.BeginObject().Key("command").Str("bench").Key(p ? "preset" : "model").Str(p ? p->name : b.model);
  j.Key("dtype").Str(DTypeName(b.dtype)).Key("backend").Str(b.backend).Key("emulate_gpu").Bool(b.target_options.cuda.emulate);
  j.Key("elements").Int(p ? b.elements : 0).Key("threads").Int(h.threads).Key("repeats").Int(b.repeats);
  AddFusionJson(j, report);
  j.Key("planning_ms").Num(h.planning_ms).Key("gemm_tuning_ms").Num(h.tuning_ms);
  j.Key("check").BeginObject().Key("rtol").Num(h.rtol).Key("atol").Num(h.atol).Key("outputs").BeginArray();
  for (const OutputReport& c : *h.checks)
    j.BeginObject().Key("name").Str(c.name).Key("max_abs_err").Num(c.max_abs).Key("max_rel_err").Num(c.max_rel)
        .Key("ok").Bool(c.ok).EndObject();
  j.EndArray().EndObject();
  j.Key("latency_ms").BeginObject().Key("unfused").Num(h.t_unfused * 1e3).Key("fused").Num(h.t_fused * 1e3);
  if (b.native) j.Key("native").Num(h.t_native * 1e3);
  j.EndObject();
  j.Key("speedup").Num(h.t_unfused / h.t_fused).Key("speedup_median_ratio").Num(1.0 / h.timing->median_ratio_to_first[1]);
  if (p) {
    j.Key("gbps").BeginObject().Key("unfused").Num(h.bytes / h.t_unfused / 1e9).Key("fused").Num(h.bytes / h.t_fused / 1e9)
        .Key("triad").Num(h.gb_triad);
    if (b.native) j.Key("native").Num(h.bytes / h.t_native / 1e9);
    j.EndObject();
    j.Key("max_rel_err_f64").Num(h.max_rel_f64);
  }
  if (target)  // the target's figures, under its name
    j.Key(b.backend).BeginObject().Key("latency_ms").BeginObject().Key("unfused").Num(target->unfused_ms)
        .Key("fused").Num(target->fused_ms).EndObject().Key("copy_gbps").Num(target->copy_gbps)
        .Key("rtol").Num(target->rtol).Key("atol").Num(target->atol).EndObject();
  j.EndObject();
  return j.WriteFile(b.json);
}

}  // namespace

int RunDemo(Args& args);  // block_demo.cc
int BenchGenerate(const std::string& path, const std::string& spec, int threads, int repeats, bool bf16_weights,
                  const std::string& json);  // bench_generate.cc

int Bench(Args& args) {
  {
    // Block presets (llama7b, llama-small, gpt2, bert) are timed by the block demo's code.
    Args probe = args;
    while (!probe.Done())
      if (probe.Next() == "--preset" && !probe.Done()) {
        const std::string name = probe.Next();
        if (BlockPreset(name).ok()) return RunDemo(args);
      }
  }
  BenchFlags b;
  if (Status st = ParseBenchFlags(args, &b); !st.ok()) return Fail(st);
  auto target = MakeCommandTarget(b.backend, b.target_options, b.dtype);
  if (!target.ok()) return Fail(target.status());
  // The plans timed kernel by kernel on the host: the target's when it is the reference's kind
  // (the CPU), else the reference's, with the target's plans run beside them.
  const bool on_reference = IsReferenceKind(**target);
  const std::shared_ptr<const Target> host =
      on_reference ? *target : std::shared_ptr<const Target>(MakeReferenceTarget(b.target_options));
  if (!b.generate.empty()) {
    if (b.model.empty()) return Fail(InvalidArgument("--generate runs a decoder: give MODEL.onnx, not a preset"));
    if (!b.shapes.empty() || !on_reference || (b.dtype != DType::kF32 && b.dtype != DType::kBF16) || b.native ||
        b.rtol_set || b.atol_set || !b.fusion.enabled || !b.trace_file.empty() ||
        b.target_options.cpu.gemm != CpuGemmEngine::kAuto)
      return Fail(InvalidArgument("--generate runs the model as exported, fused, on the CPU (f32, or with --dtype bf16 "
                                  "its GEMM weights in bf16), every call with its own shapes: it takes --threads, "
                                  "--repeats, --dtype f32|bf16 and --json only"));
    return BenchGenerate(b.model, b.generate, b.threads, b.repeats_set ? b.repeats : 3, b.dtype == DType::kBF16,
                         b.json);
  }
  // On the CPU --dtype bf16 holds GEMM weights in bf16: an elementwise preset has none.
  const bool cpu_bf16 = on_reference && b.dtype == DType::kBF16;
  if (cpu_bf16 && !b.preset.empty())
    return Fail(InvalidArgument("--dtype bf16 on the CPU holds GEMM weights in bf16, and preset '", b.preset,
                                "' has no GEMM; it computes in bf16 on --backend cuda"));
  const PrepareOptions prepare{
      .bf16_weights = cpu_bf16, .gemm_engine = b.target_options.cpu.gemm, .threads = b.threads};
  // Both plans hold bf16 weights, but they round different GEMM inputs (the fused one's A is
  // normalized inside the GEMM, say): fused and unfused agree within bf16's tolerance, as run
  // --dtype bf16 checks, unless --rtol / --atol say otherwise.
  double rtol = b.rtol, atol = b.atol;
  if (cpu_bf16) {
    if (!b.rtol_set) rtol = NarrowTolerance(DType::kBF16);
    if (!b.atol_set) atol = NarrowTolerance(DType::kBF16);
  }

  // Two copies of the graph: one planned without fusion (the baseline), one with; the fused
  // one's planning (import for these shapes, passes, executor plan) is timed.
  const ElementwisePreset* p = nullptr;
  std::string text;
  const int64_t elements = b.elements;
  if (!b.preset.empty()) {
    p = FindElementwisePreset(b.preset);
    if (!p) return Fail(InvalidArgument("unknown preset '", b.preset, "' (chain, gelu, silu, residual; blocks: llama7b, llama-small, gpt2, bert)"));
    const int64_t cols = elements % 4096 == 0 ? 4096 : elements;
    text = p->text(elements / cols, cols);
  }
  const std::function<Result<std::unique_ptr<Graph>>()> load = [&]() -> Result<std::unique_ptr<Graph>> {
    if (p) return ParseGraph(text);
    return ImportOnnxFileWithShapes(b.model, b.shapes);
  };
  FusionReport report;
  PipelineOptions off, on;
  off.fusion.enabled = false;
  on.fusion = b.fusion;
  on.fusion_report = &report;
  auto loaded = load();
  if (!loaded.ok()) return Fail(loaded.status());
  std::unique_ptr<Graph> base = std::move(*loaded);
  if (auto r = RunPipeline(*base, *host, off); !r.ok()) return Fail(r.status());
  auto base_plan = ExecutionPlan::Compile(*base, prepare);
  if (!base_plan.ok()) return Fail(base_plan.status());
  const auto planning_start = std::chrono::steady_clock::now();
  loaded = load();
  if (!loaded.ok()) return Fail(loaded.status());
  std::unique_ptr<Graph> fused = std::move(*loaded);
  if (auto r = RunPipeline(*fused, *host, on); !r.ok()) return Fail(r.status());
  auto fused_plan = ExecutionPlan::Compile(*fused, prepare);
  if (!fused_plan.ok()) return Fail(fused_plan.status());
  const double planning_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - planning_start).count();
  const double tuning_ms = (*base_plan)->stats().gemm_tuning_ms + (*fused_plan)->stats().gemm_tuning_ms;

  std::fprintf(stderr, "graphfuse bench: preparing inputs...\n");
  std::mt19937 rng(7);
  auto ins = RandomInputs(*base, rng);
  if (!ins.ok()) return Fail(ins.status());
  Outputs out_a(*base), out_b(*base);
  std::vector<TensorView> iv;
  for (const Tensor& t : *ins) iv.push_back(t.view());
  ThreadPool pool(b.threads);
  const CpuContext ctx{&pool};
  if (Status s = (*base_plan)->Run(iv, out_a.views, ctx); !s.ok()) return Fail(s);
  if (Status s = (*fused_plan)->Run(iv, out_b.views, ctx); !s.ok()) return Fail(s);
  // --cpu-codegen: the fused plan once more, its groups compiled to native loops (a plan of
  // its own, so that the two keep their own prepared launches), timed in the same rounds.
  std::unique_ptr<CpuCodegen> codegen;
  std::unique_ptr<ExecutionPlan> native_plan;
  CpuContext native_ctx = ctx;
  Outputs out_c(*base);
  if (b.native) {
    auto cg = AttachCodegen(native_ctx);
    if (!cg.ok()) return Fail(cg.status());
    codegen = std::move(*cg);
    auto np = ExecutionPlan::Compile(*fused, prepare);
    if (!np.ok()) return Fail(np.status());
    native_plan = std::move(*np);
    std::fprintf(stderr, "graphfuse bench: compiling native kernels (cache: %s)...\n", codegen->cache_dir().c_str());
    if (Status s = native_plan->Run(iv, out_c.views, native_ctx); !s.ok()) return Fail(s);
    for (size_t k = 0; k < out_c.tensors.size(); ++k)
      if (std::memcmp(out_c.tensors[k].data(), out_b.tensors[k].data(), out_b.tensors[k].nbytes()) != 0) {
        std::fprintf(stderr, "graphfuse bench: the native kernels' output %zu differs from the tile executor's\n", k);
        return kExitMismatch;
      }
  }

  // Checks: fused against unfused on the same inputs, as `run` checks against a reference
  // (--rtol / --atol), and (presets) against float64 at samples.
  std::vector<OutputReport> checks;
  bool same = true;
  double check_abs = 0, check_rel = 0;  // the largest over all outputs
  for (size_t k = 0; k < out_a.tensors.size(); ++k) {
    const OutputReport& c =
        checks.emplace_back(Compare(base->outputs()[k]->name(), out_b.tensors[k], out_a.tensors[k], rtol, atol));
    same &= c.ok;
    check_abs = std::max(check_abs, c.max_abs), check_rel = std::max(check_rel, c.max_rel);
  }
  double max_rel_f64 = 0;
  if (p) {
    const int64_t n = out_b.tensors[0].numel();
    for (int s = 0; s < 4096; ++s) {
      const int64_t i = s < 2048 ? s % n : static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
      auto ref = ReferenceEvalAt(*base, iv, i);
      if (!ref.ok()) return Fail(ref.status());
      const double got = out_b.tensors[0].GetAsDouble(i), want = (*ref)[0];
      max_rel_f64 = std::max(max_rel_f64, std::fabs(got - want) / std::max(std::fabs(want), 1e-6));
    }
  }
  if (!same) {
    std::fprintf(stderr, "graphfuse bench: fused and unfused results differ (|fused - unfused| <= %g + %g * |unfused|):\n",
                 atol, rtol);
    for (const OutputReport& c : checks)
      std::fprintf(stderr, "  %-24s max |err| %.3g  max rel %.3g  %lld mismatches  %s\n", c.name.c_str(), c.max_abs,
                   c.max_rel, static_cast<long long>(c.mismatches), c.ok ? "ok" : "DIFFERS");
    return kExitMismatch;
  }

  // Interleaved timing: unfused, fused, and (presets) the same-run STREAM triad over `elements`.
  Tensor ta = Tensor::Empty(DType::kF32, {elements}).value(), tb = Tensor::Empty(DType::kF32, {elements}).value(),
         tc = Tensor::Empty(DType::kF32, {elements}).value();
  for (int64_t i = 0; i < elements; ++i) tb.data_as<float>()[i] = 1.f, tc.data_as<float>()[i] = 2.f, ta.data_as<float>()[i] = 0.f;
  const int triad_threads = ctx.ThreadsFor(elements);
  std::vector<std::function<void()>> fs = {
      [&] { (void)(*base_plan)->Run(iv, out_a.views, ctx); },
      [&] { (void)(*fused_plan)->Run(iv, out_b.views, ctx); },
  };
  if (p)
    fs.push_back([&] {
      StreamTriad(pool, triad_threads, ta.data_as<float>(), tb.data_as<float>(), tc.data_as<float>(), elements);
    });
  if (b.native) fs.push_back([&] { (void)native_plan->Run(iv, out_c.views, native_ctx); });
  const InterleavedTiming t = MeasureInterleaved(fs, b.repeats, elements >= (1 << 22) ? 2e-3 : 2e-4);
  const double t_unfused = t.timings[0].median_s, t_fused = t.timings[1].median_s;
  // --trace: after the timing, a few runs of each plan with every kernel timed.
  BenchTrace trace{std::string(host->name())};
  std::vector<KernelChoice> choices[2];
  if (!b.trace_file.empty()) {
    choices[0] = host->DescribeKernels(*base);
    choices[1] = host->DescribeKernels(*fused);
    Status st = trace.Record(*base, nullptr, choices[0], "cpu plan, unfused", (*base_plan)->stats().kernels_launched,
                             [&](StepLog& log) { return (*base_plan)->Run(iv, out_a.views, ctx, nullptr, nullptr, &log); });
    if (st.ok())
      st = trace.Record(*fused, &report, choices[1], "cpu plan, fused", (*fused_plan)->stats().kernels_launched,
                        [&](StepLog& log) { return (*fused_plan)->Run(iv, out_b.views, ctx, nullptr, nullptr, &log); });
    if (!st.ok()) return Fail(st);
  }
  const double t_native = b.native ? t.timings.back().median_s : 0;
  const double bytes = static_cast<double>(IoBytes(*base));
  const double gb_fused = bytes / t_fused / 1e9;
  const double gb_triad = p ? 12.0 * elements / t.timings[2].median_s / 1e9 : 0;

  std::printf("bench %s%s: %lld kernels unfused, %lld fused; %d thread(s) max; median of %d interleaved samples\n",
              p ? "preset " : "", p ? p->name : b.model.c_str(), static_cast<long long>(report.kernels_before),
              static_cast<long long>(report.kernels_after), pool.num_threads(), b.repeats);
  if (p) std::printf("  %s, %lld f32 elements\n", p->what, static_cast<long long>(elements));
  std::printf("  planning the fused plan: %.2f ms (import for these shapes, passes, executor plan)\n", planning_ms);
  if (tuning_ms > 0)
    std::printf("  timing the GEMM engines (both plans; once per machine, then cached): %.2f ms\n", tuning_ms);
  // GB/s only for the presets, whose bytes are all input and output.
  auto row = [&](const char* name, double s, const char* note) {
    if (p) std::printf("  %-10s %10.4f ms %10.1f%s\n", name, s * 1e3, bytes / s / 1e9, note);
    else std::printf("  %-10s %10.4f ms%s\n", name, s * 1e3, note);
  };
  std::printf("  %-10s %12s %10s\n", "", "latency", p ? "GB/s" : "");
  row("unfused", t_unfused, "");
  row("fused", t_fused, "");
  if (b.native) row("native", t_native, "   (fused, groups as native loops)");
  if (p) std::printf("  %-10s %10.4f ms %10.1f   (12 B/element, same pool)\n", "triad", t.timings[2].median_s * 1e3, gb_triad);
  std::printf("  fused is %.2fx unfused (median of per-round ratios %.2fx)%s\n", t_unfused / t_fused,
              1.0 / t.median_ratio_to_first[1], p ? StrCat("; ", std::lround(100 * gb_fused / gb_triad), "% of triad").c_str() : "");
  if (b.native)
    std::printf("  native is %.2fx unfused (median of per-round ratios %.2fx)%s; native loops: %s\n", t_unfused / t_native,
                1.0 / t.median_ratio_to_first.back(),
                p ? StrCat("; ", std::lround(100 * bytes / t_native / 1e9 / gb_triad), "% of triad").c_str() : "",
                codegen->Summary().c_str());
  std::printf("  checks: fused vs unfused max |err| %.3g, max rel %.3g (within %g + %g * |unfused|)%s", check_abs,
              check_rel, atol, rtol, b.native ? "; fused == native (bitwise)" : "");
  if (p) std::printf("; max rel error vs float64 at 4096 sampled elements: %.2g", max_rel_f64);
  std::printf("\n");
  TargetFigures target_figures;
  if (!on_reference) {
    const HostRun host_run{load, off, on, *base, iv, {&out_a.tensors, &out_b.tensors}, bytes};
    if (int rc = BenchOnTarget(b, **target, host_run, &trace, &target_figures); rc != kExitOk) return rc;
  }
  if (!b.trace_file.empty()) {
    if (Status st = trace.recorder().WriteFile(b.trace_file); !st.ok()) return Fail(st);
    std::printf("  trace: %s (%lld events: 3 runs of each plan, every kernel timed; open in https://ui.perfetto.dev)\n",
                b.trace_file.c_str(), static_cast<long long>(trace.recorder().events()));
  }
  if (!b.json.empty()) {
    const HostFigures h{p, pool.num_threads(), planning_ms, rtol, atol, tuning_ms, &checks,
                        &t, t_unfused, t_fused, t_native, bytes, gb_triad, max_rel_f64};
    if (!WriteBenchJson(b, report, h, on_reference ? nullptr : &target_figures))
      return Fail(InvalidArgument("cannot write --json file '", b.json, "'"));
  }
  return kExitOk;
}

}  // namespace graphfuse::cli
