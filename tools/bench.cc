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

#ifdef GF_HAVE_CUDA
#include "cuda/cuda_executor.h"
#endif

namespace graphfuse::cli {
namespace {

int Fail(const Status& s) { return FailUsage("bench", s); }

int64_t IoBytes(const Graph& g) {
  int64_t b = 0;
  for (const Value* v : g.inputs()) b += v->numel() * static_cast<int64_t>(DTypeSize(v->dtype()));
  for (const Value* v : g.outputs()) b += v->numel() * static_cast<int64_t>(DTypeSize(v->dtype()));
  return b;
}

}  // namespace

int RunDemo(Args& args);  // block_demo.cc
int BenchGenerate(const std::string& path, const std::string& spec, int threads, int repeats,
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
  std::string model, preset, json, trace_file, backend = "cpu", generate;
  int64_t elements = 1 << 20;
  int threads = 0, repeats = 21;
  double rtol = kDefaultRtol, atol = kDefaultAtol;
  bool native = false, emulate_gpu = false, rtol_set = false, atol_set = false, repeats_set = false;
  DType dtype = DType::kF32;  // what the GPU's plans compute in (--dtype)
  FusionOptions fusion;
  std::map<std::string, Shape> shapes;
  while (!args.Done()) {
    const std::string f = args.Next();
    if (f == "--shape") {
      auto v = args.Value(f);
      if (!v.ok()) return Fail(v.status());
      if (Status st = ParseShapeFlag(*v, &shapes); !st.ok()) return Fail(st);
    } else if (f == "--cpu-codegen") {
      native = true;
    } else if (f == "--emulate-gpu") {
      emulate_gpu = true;
    } else if (f == "--dtype") {
      auto v = args.Dtype(f);
      if (!v.ok()) return Fail(v.status());
      dtype = *v;
    } else if (f == "--backend") {
      auto v = args.Backend(f);
      if (!v.ok()) return Fail(v.status());
      backend = *v;
    } else if (f == "--generate") {
      auto v = args.Value(f);
      if (!v.ok()) return Fail(v.status());
      generate = *v;
    } else if (f == "--trace") {
      auto v = args.OutputFile(f);
      if (!v.ok()) return Fail(v.status());
      trace_file = *v;
    } else if (f == "--preset" || f == "--json") {
      auto v = f == "--json" ? args.OutputFile(f) : args.Value(f);
      if (!v.ok()) return Fail(v.status());
      (f == "--preset" ? preset : json) = *v;
    } else if (f == "--elements") {
      auto v = args.Int(f, 1, int64_t{1} << 30);
      if (!v.ok()) return Fail(v.status());
      elements = *v;
    } else if (f == "--rtol" || f == "--atol") {
      auto v = args.Float(f, 0, 1e6);
      if (!v.ok()) return Fail(v.status());
      (f == "--rtol" ? rtol : atol) = *v;
      (f == "--rtol" ? rtol_set : atol_set) = true;
    } else if (f == "--threads" || f == "--repeats") {
      auto v = args.Int(f, 1, f == "--threads" ? 256 : 1001);
      if (!v.ok()) return Fail(v.status());
      (f == "--threads" ? threads : repeats) = static_cast<int>(*v);
      repeats_set |= f == "--repeats";
    } else if (auto flag = ParseFusionFlag(f, args, &fusion); !flag.ok()) {
      return Fail(flag.status());
    } else if (*flag) {
      // consumed
    } else if (!f.empty() && f[0] == '-') {
      return Fail(InvalidArgument("unknown flag '", f, "' (see graphfuse --help)"));
    } else if (model.empty()) {
      model = f;
    } else {
      return Fail(InvalidArgument("unexpected argument '", f, "'"));
    }
  }
  if (!shapes.empty() && model.empty()) return Fail(InvalidArgument("--shape binds a model's input dims; give a model"));
  if (model.empty() == preset.empty())
    return Fail(InvalidArgument("give a model or --preset NAME (chain, gelu, silu, residual; blocks: llama7b, llama-small, gpt2, bert), not both"));

  if (!generate.empty()) {
    if (model.empty()) return Fail(InvalidArgument("--generate runs a decoder: give MODEL.onnx, not a preset"));
    if (!shapes.empty() || backend != "cpu" || dtype != DType::kF32 || native || emulate_gpu || rtol_set || atol_set ||
        !fusion.enabled || !trace_file.empty())
      return Fail(InvalidArgument("--generate runs the model as exported, fused, in f32 on the CPU, every call with "
                                  "its own shapes: it takes --threads, --repeats and --json only"));
    return BenchGenerate(model, generate, threads, repeats_set ? repeats : 3, json);
  }
  if (emulate_gpu && backend != "cuda") return Fail(InvalidArgument("--emulate-gpu needs --backend cuda"));
  if (Status st = CheckDtypeBackend("bench", dtype, backend); !st.ok()) return Fail(st);
  // On the CPU --dtype bf16 holds GEMM weights in bf16: an elementwise preset has none.
  const bool cpu_bf16 = backend == "cpu" && dtype == DType::kBF16;
  if (cpu_bf16 && !preset.empty())
    return Fail(InvalidArgument("--dtype bf16 on the CPU holds GEMM weights in bf16, and preset '", preset,
                                "' has no GEMM; it computes in bf16 on --backend cuda"));
  const PrepareOptions prepare{.bf16_weights = cpu_bf16};
  // Both plans hold bf16 weights, but they round different GEMM inputs (the fused one's A is
  // normalized inside the GEMM, say): fused and unfused agree within bf16's tolerance, as run
  // --dtype bf16 checks, unless --rtol / --atol say otherwise.
  if (cpu_bf16) {
    if (!rtol_set) rtol = NarrowTolerance(DType::kBF16);
    if (!atol_set) atol = NarrowTolerance(DType::kBF16);
  }
  if (backend == "cuda" && !emulate_gpu)
    if (Status st = CheckCudaBackend(); !st.ok()) return Fail(st);

  // Two copies of the graph: one planned without fusion (the baseline), one with; the fused
  // one's planning (import for these shapes, passes, executor plan) is timed.
  const ElementwisePreset* p = nullptr;
  std::string text;
  if (!preset.empty()) {
    p = FindElementwisePreset(preset);
    if (!p) return Fail(InvalidArgument("unknown preset '", preset, "' (chain, gelu, silu, residual; blocks: llama7b, llama-small, gpt2, bert)"));
    const int64_t cols = elements % 4096 == 0 ? 4096 : elements;
    text = p->text(elements / cols, cols);
  }
  auto load = [&]() -> Result<std::unique_ptr<Graph>> {
    if (p) return ParseGraph(text);
    return ImportOnnxFileWithShapes(model, shapes);
  };
  auto target = MakeTarget(backend);
  if (!target.ok()) return Fail(target.status());
  FusionReport report;
  PipelineOptions off, on;
  off.fusion.enabled = false;
  on.fusion = fusion;
  on.fusion_report = &report;
  auto loaded = load();
  if (!loaded.ok()) return Fail(loaded.status());
  std::unique_ptr<Graph> base = std::move(*loaded);
  if (auto r = RunPipeline(*base, **target, off); !r.ok()) return Fail(r.status());
  auto base_plan = ExecutionPlan::Compile(*base, prepare);
  if (!base_plan.ok()) return Fail(base_plan.status());
  const auto planning_start = std::chrono::steady_clock::now();
  loaded = load();
  if (!loaded.ok()) return Fail(loaded.status());
  std::unique_ptr<Graph> fused = std::move(*loaded);
  if (auto r = RunPipeline(*fused, **target, on); !r.ok()) return Fail(r.status());
  auto fused_plan = ExecutionPlan::Compile(*fused, prepare);
  if (!fused_plan.ok()) return Fail(fused_plan.status());
  const double planning_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - planning_start).count();

  std::fprintf(stderr, "graphfuse bench: preparing inputs...\n");
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-2, 2);
  std::vector<Tensor> ins, out_a, out_b;
  // Integer inputs are 0 or 1: valid token ids, attention masks, token types and positions.
  for (const Value* v : base->inputs()) {
    auto t = Tensor::Empty(v->dtype(), v->shape());
    if (!t.ok()) return Fail(t.status());
    for (int64_t i = 0; i < t->numel(); ++i) t->SetFromDouble(i, IsFloat(v->dtype()) ? u(rng) : double(rng() % 2));
    ins.push_back(std::move(*t));
  }
  for (const Value* v : base->outputs()) {
    out_a.push_back(Tensor::Empty(v->dtype(), v->shape()).value());
    out_b.push_back(Tensor::Empty(v->dtype(), v->shape()).value());
  }
  std::vector<TensorView> iv, av, bv;
  for (const Tensor& t : ins) iv.push_back(t.view());
  for (const Tensor& t : out_a) av.push_back(t.view());
  for (const Tensor& t : out_b) bv.push_back(t.view());
  ThreadPool pool(threads);
  const CpuContext ctx{&pool};
  if (Status s = (*base_plan)->Run(iv, av, ctx); !s.ok()) return Fail(s);
  if (Status s = (*fused_plan)->Run(iv, bv, ctx); !s.ok()) return Fail(s);
  // --cpu-codegen: the fused plan once more, its groups compiled to native loops (a plan of
  // its own, so that the two keep their own prepared launches), timed in the same rounds.
  std::unique_ptr<CpuCodegen> codegen;
  std::unique_ptr<ExecutionPlan> native_plan;
  CpuContext native_ctx = ctx;
  std::vector<Tensor> out_c;
  std::vector<TensorView> cv;
  if (native) {
    auto cg = AttachCodegen(native_ctx);
    if (!cg.ok()) return Fail(cg.status());
    codegen = std::move(*cg);
    auto np = ExecutionPlan::Compile(*fused, prepare);
    if (!np.ok()) return Fail(np.status());
    native_plan = std::move(*np);
    for (const Value* v : base->outputs()) out_c.push_back(Tensor::Empty(v->dtype(), v->shape()).value());
    for (const Tensor& t : out_c) cv.push_back(t.view());
    std::fprintf(stderr, "graphfuse bench: compiling native kernels (cache: %s)...\n", codegen->cache_dir().c_str());
    if (Status s = native_plan->Run(iv, cv, native_ctx); !s.ok()) return Fail(s);
    for (size_t k = 0; k < out_c.size(); ++k)
      if (std::memcmp(out_c[k].data(), out_b[k].data(), out_b[k].nbytes()) != 0) {
        std::fprintf(stderr, "graphfuse bench: the native kernels' output %zu differs from the tile executor's\n", k);
        return kExitMismatch;
      }
  }

  // Checks: fused against unfused on the same inputs, as `run` checks against a reference
  // (--rtol / --atol), and (presets) against float64 at samples.
  std::vector<OutputReport> checks;
  bool same = true;
  double check_abs = 0, check_rel = 0;  // the largest over all outputs
  for (size_t k = 0; k < out_a.size(); ++k) {
    const OutputReport& c = checks.emplace_back(Compare(base->outputs()[k]->name(), out_b[k], out_a[k], rtol, atol));
    same &= c.ok;
    check_abs = std::max(check_abs, c.max_abs), check_rel = std::max(check_rel, c.max_rel);
  }
  double max_rel_f64 = 0;
  if (p) {
    const int64_t n = out_b[0].numel();
    for (int s = 0; s < 4096; ++s) {
      const int64_t i = s < 2048 ? s % n : static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
      auto ref = ReferenceEvalAt(*base, iv, i);
      if (!ref.ok()) return Fail(ref.status());
      const double got = out_b[0].GetAsDouble(i), want = (*ref)[0];
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
      [&] { (void)(*base_plan)->Run(iv, av, ctx); },
      [&] { (void)(*fused_plan)->Run(iv, bv, ctx); },
  };
  if (p)
    fs.push_back([&] {
      StreamTriad(pool, triad_threads, ta.data_as<float>(), tb.data_as<float>(), tc.data_as<float>(), elements);
    });
  if (native) fs.push_back([&] { (void)native_plan->Run(iv, cv, native_ctx); });
  const InterleavedTiming t = MeasureInterleaved(fs, repeats, elements >= (1 << 22) ? 2e-3 : 2e-4);
  const double t_unfused = t.timings[0].median_s, t_fused = t.timings[1].median_s;
  // --trace: after the timing, a few runs of each plan with every kernel timed.
  TraceRecorder trace;
  std::vector<KernelChoice> choices[2];
  auto record = [&](const Graph& g, const FusionReport* r, const std::vector<KernelChoice>& c, const std::string& what,
                    int64_t kernels, const std::function<Status(StepLog&)>& run) -> Status {
    for (int k = 0; k < 3; ++k) {
      StepLog log;
      TracedRun tr;
      tr.graph = &g;
      tr.report = r;
      tr.kernel_choices = &c;
      tr.signature = what;
      tr.target = backend;
      tr.kernels = kernels;
      tr.start_ns = tr.run_start_ns = SteadyClockNs();
      GF_RETURN_IF_ERROR(run(log));
      tr.end_ns = SteadyClockNs();
      tr.steps = &log.steps;
      trace.Record(tr);
    }
    return Status::Ok();
  };
  if (!trace_file.empty()) {
    choices[0] = (*target)->DescribeKernels(*base);
    choices[1] = (*target)->DescribeKernels(*fused);
    Status st = record(*base, nullptr, choices[0], "cpu plan, unfused", (*base_plan)->stats().kernels_launched,
                       [&](StepLog& log) { return (*base_plan)->Run(iv, av, ctx, nullptr, nullptr, &log); });
    if (st.ok())
      st = record(*fused, &report, choices[1], "cpu plan, fused", (*fused_plan)->stats().kernels_launched,
                  [&](StepLog& log) { return (*fused_plan)->Run(iv, bv, ctx, nullptr, nullptr, &log); });
    if (!st.ok()) return Fail(st);
  }
  const double t_native = native ? t.timings.back().median_s : 0;
  const double bytes = static_cast<double>(IoBytes(*base));
  const double gb_unfused = bytes / t_unfused / 1e9, gb_fused = bytes / t_fused / 1e9;
  const double gb_triad = p ? 12.0 * elements / t.timings[2].median_s / 1e9 : 0;

  std::printf("bench %s%s: %lld kernels unfused, %lld fused; %d thread(s) max; median of %d interleaved samples\n",
              p ? "preset " : "", p ? p->name : model.c_str(), static_cast<long long>(report.kernels_before),
              static_cast<long long>(report.kernels_after), pool.num_threads(), repeats);
  if (p) std::printf("  %s, %lld f32 elements\n", p->what, static_cast<long long>(elements));
  std::printf("  planning the fused plan: %.2f ms (import for these shapes, passes, executor plan)\n", planning_ms);
  // GB/s only for the presets, whose bytes are all input and output.
  auto row = [&](const char* name, double s, const char* note) {
    if (p) std::printf("  %-10s %10.4f ms %10.1f%s\n", name, s * 1e3, bytes / s / 1e9, note);
    else std::printf("  %-10s %10.4f ms%s\n", name, s * 1e3, note);
  };
  std::printf("  %-10s %12s %10s\n", "", "latency", p ? "GB/s" : "");
  row("unfused", t_unfused, "");
  row("fused", t_fused, "");
  if (native) row("native", t_native, "   (fused, groups as native loops)");
  if (p) std::printf("  %-10s %10.4f ms %10.1f   (12 B/element, same pool)\n", "triad", t.timings[2].median_s * 1e3, gb_triad);
  std::printf("  fused is %.2fx unfused (median of per-round ratios %.2fx)%s\n", t_unfused / t_fused,
              1.0 / t.median_ratio_to_first[1], p ? StrCat("; ", std::lround(100 * gb_fused / gb_triad), "% of triad").c_str() : "");
  if (native)
    std::printf("  native is %.2fx unfused (median of per-round ratios %.2fx)%s; native loops: %s\n", t_unfused / t_native,
                1.0 / t.median_ratio_to_first.back(),
                p ? StrCat("; ", std::lround(100 * bytes / t_native / 1e9 / gb_triad), "% of triad").c_str() : "",
                CodegenSummary(*codegen).c_str());
  std::printf("  checks: fused vs unfused max |err| %.3g, max rel %.3g (within %g + %g * |unfused|)%s", check_abs,
              check_rel, atol, rtol, native ? "; fused == native (bitwise)" : "");
  if (p) std::printf("; max rel error vs float64 at 4096 sampled elements: %.2g", max_rel_f64);
  std::printf("\n");
#ifdef GF_HAVE_CUDA
  // --backend cuda: both plans on GPU 0 (checked against the CPU's outputs), median device
  // time of `repeats` replays each, beside a same-run device-to-device copy of one tensor.
  // --dtype bf16 / f16: the GPU's plans are of the model converted to that dtype before the
  // passes (as `run` converts it), checked against the CPU's f32 plans within that dtype's
  // tolerance unless --rtol / --atol are given. --emulate-gpu: the plans on the host (no GPU;
  // the times are the host's, of one run, and there is no copy to compare with).
  double cuda_unfused_ms = 0, cuda_fused_ms = 0, cuda_copy_gbps = 0;
  const double gpu_rtol = dtype != DType::kF32 && !rtol_set ? NarrowTolerance(dtype) : rtol;
  const double gpu_atol = dtype != DType::kF32 && !atol_set ? NarrowTolerance(dtype) : atol;
  if (backend == "cuda") {
    double ms[2] = {0, 0};
    std::unique_ptr<Graph> narrow[2];
    if (dtype != DType::kF32) {
      PipelineOptions narrow_on = on;
      narrow_on.fusion_report = nullptr;  // the report is the f32 plan's
      for (int k = 0; k < 2; ++k) {
        auto src = load();
        if (!src.ok()) return Fail(src.status());
        auto converted = ConvertPrecision(**src, dtype);
        if (!converted.ok()) return Fail(converted.status().WithContext(StrCat("--dtype ", DTypeName(dtype))));
        narrow[k] = std::move(*converted);
        if (auto r = RunPipeline(*narrow[k], **target, k == 0 ? off : narrow_on); !r.ok())
          return Fail(r.status().WithContext(StrCat("--dtype ", DTypeName(dtype))));
      }
    }
    const Graph* graphs[2] = {narrow[0] ? narrow[0].get() : base.get(), narrow[1] ? narrow[1].get() : fused.get()};
    const std::vector<Tensor>* want[2] = {&out_a, &out_b};
    for (int k = 0; k < 2; ++k) {
      cuda::CudaExecOptions co;
      co.emulate = emulate_gpu;
      auto ex = cuda::CudaExecutor::Create(*graphs[k], co);
      if (!ex.ok()) return Fail(ex.status().WithContext("--backend cuda"));
      auto got = (*ex)->Run(iv);
      if (!got.ok()) return Fail(got.status().WithContext("--backend cuda"));
      for (size_t o = 0; o < got->size(); ++o) {
        const OutputReport c = Compare(base->outputs()[o]->name(), (*got)[o], (*want[k])[o], gpu_rtol, gpu_atol);
        if (!c.ok) {
          std::fprintf(stderr, "graphfuse bench: the GPU's output '%s' differs from the CPU's: max |err| %.3g, max rel %.3g, %lld mismatches\n",
                       c.name.c_str(), c.max_abs, c.max_rel, static_cast<long long>(c.mismatches));
          return kExitMismatch;
        }
      }
      auto median_ms = (*ex)->MedianReplayMs(emulate_gpu ? 1 : repeats);
      if (!median_ms.ok()) return Fail(median_ms.status());
      ms[k] = *median_ms;
      if (!trace_file.empty() && !emulate_gpu) {
        // Device times of each step (CUDA events around it), as graphfuse/profiling.h places them.
        Status st = record(*graphs[k], k == 1 && !narrow[1] ? &report : nullptr, choices[k],
                           k == 0 ? "cuda plan, unfused" : "cuda plan, fused", (*ex)->stats().launches,
                           [&](StepLog& log) -> Status {
                             GF_ASSIGN_OR_RETURN(log.steps, (*ex)->DeviceSteps(SteadyClockNs()));
                             return Status::Ok();
                           });
        if (!st.ok()) return Fail(st);
      }
    }
    cuda_unfused_ms = ms[0], cuda_fused_ms = ms[1];
    const std::string agree = dtype == DType::kF32 ? "outputs == CPU's"
                                                   : StrCat("in ", DTypeName(dtype), ", outputs within ", gpu_atol, " + ",
                                                            gpu_rtol, " * |CPU's f32|");
    if (emulate_gpu) {
      std::printf("  GPU plans emulated on the host (no GPU used): unfused %.1f ms, fused %.1f ms (host time of one run); %s\n",
                  cuda_unfused_ms, cuda_fused_ms, agree.c_str());
    } else {
      auto copy_ms = cuda::DeviceCopyMs(elements * 4, repeats);
      if (!copy_ms.ok()) return Fail(copy_ms.status());
      cuda_copy_gbps = 8.0 * elements / (*copy_ms * 1e-3) / 1e9;
      std::printf("  GPU 0: unfused %.4f ms (%.1f GB/s), fused %.4f ms (%.1f GB/s; %.0f%% of copy), "
                  "device copy %.1f GB/s (read + write); %s\n",
                  cuda_unfused_ms, bytes / (cuda_unfused_ms * 1e-3) / 1e9, cuda_fused_ms,
                  bytes / (cuda_fused_ms * 1e-3) / 1e9, 100 * bytes / (cuda_fused_ms * 1e-3) / 1e9 / cuda_copy_gbps,
                  cuda_copy_gbps, agree.c_str());
    }
  }
#endif
  if (!trace_file.empty()) {
    if (Status st = trace.WriteFile(trace_file); !st.ok()) return Fail(st);
    std::printf("  trace: %s (%lld events: 3 runs of each plan, every kernel timed; open in https://ui.perfetto.dev)\n",
                trace_file.c_str(), static_cast<long long>(trace.events()));
  }
  if (!json.empty()) {
    Json j;
    j.BeginObject().Key("command").Str("bench").Key(p ? "preset" : "model").Str(p ? p->name : model);
    j.Key("dtype").Str(DTypeName(dtype)).Key("backend").Str(backend).Key("emulate_gpu").Bool(emulate_gpu);
    j.Key("elements").Int(p ? elements : 0).Key("threads").Int(pool.num_threads()).Key("repeats").Int(repeats);
    AddFusionJson(j, report);
    j.Key("planning_ms").Num(planning_ms);
    j.Key("check").BeginObject().Key("rtol").Num(rtol).Key("atol").Num(atol).Key("outputs").BeginArray();
    for (const OutputReport& c : checks)
      j.BeginObject().Key("name").Str(c.name).Key("max_abs_err").Num(c.max_abs).Key("max_rel_err").Num(c.max_rel)
          .Key("ok").Bool(c.ok).EndObject();
    j.EndArray().EndObject();
    j.Key("latency_ms").BeginObject().Key("unfused").Num(t_unfused * 1e3).Key("fused").Num(t_fused * 1e3);
    if (native) j.Key("native").Num(t_native * 1e3);
    j.EndObject();
    j.Key("speedup").Num(t_unfused / t_fused).Key("speedup_median_ratio").Num(1.0 / t.median_ratio_to_first[1]);
    if (p) {
      j.Key("gbps").BeginObject().Key("unfused").Num(gb_unfused).Key("fused").Num(gb_fused).Key("triad").Num(gb_triad);
      if (native) j.Key("native").Num(bytes / t_native / 1e9);
      j.EndObject();
      j.Key("max_rel_err_f64").Num(max_rel_f64);
    }
#ifdef GF_HAVE_CUDA
    if (backend == "cuda")
      j.Key("cuda").BeginObject().Key("latency_ms").BeginObject().Key("unfused").Num(cuda_unfused_ms)
          .Key("fused").Num(cuda_fused_ms).EndObject().Key("copy_gbps").Num(cuda_copy_gbps)
          .Key("rtol").Num(gpu_rtol).Key("atol").Num(gpu_atol).EndObject();
#endif
    j.EndObject();
    if (!j.WriteFile(json)) return Fail(InvalidArgument("cannot write --json file '", json, "'"));
  }
  return kExitOk;
}

}  // namespace graphfuse::cli
