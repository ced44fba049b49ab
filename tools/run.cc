// `graphfuse run MODEL.onnx [--data DIR | --shape NAME=D0xD1...] ...`: plans a model for the
// inputs' shapes, runs it on the CPU and compares its outputs with the expected ones
// (numpy.allclose: |out - ref| <= atol + rtol * |ref|).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cli_common.h"
#include "compare.h"
#include "graphfuse/cpu.h"
#include "graphfuse/cpu_codegen.h"
#include "graphfuse/profiling.h"
#include "fusion_report.h"
#include "core/json.h"
#include "onnx/import.h"
#include "passes/convert_precision.h"
#include "passes/pipeline.h"
#include "runtime/signature.h"
#include "cpu/executor.h"
#ifdef GF_HAVE_CUDA
#include "cuda/cuda_executor.h"
#endif

namespace graphfuse::cli {
namespace {

struct RunOptions {
  std::string model, data, json, trace, backend = "cpu";
  std::string cuda_attention;  // "flash" / "gemms": prefill attention's form on the CUDA backend
  double rtol = kDefaultRtol, atol = kDefaultAtol;
  int threads = 0;
  bool check_fusion = false, cuda_graph = false, emulate_gpu = false, cpu_codegen = false;
  bool tf32 = false;  // f32 GEMMs in TF32 on the CUDA backend (--tf32)
  bool rtol_set = false, atol_set = false;
  DType dtype = DType::kF32;  // what the model computes in (--dtype)
  FusionOptions fusion;
  std::map<std::string, Shape> shapes;
};

Result<RunOptions> ParseRun(Args& args) {
  RunOptions o;
  while (!args.Done()) {
    const std::string f = args.Next();
    if (f == "--data") {
      GF_ASSIGN_OR_RETURN(o.data, args.Value(f));
    } else if (f == "--shape") {
      GF_ASSIGN_OR_RETURN(std::string v, args.Value(f));
      GF_RETURN_IF_ERROR(ParseShapeFlag(v, &o.shapes));
    } else if (f == "--json") {
      GF_ASSIGN_OR_RETURN(o.json, args.OutputFile(f));
    } else if (f == "--trace") {
      GF_ASSIGN_OR_RETURN(o.trace, args.OutputFile(f));
    } else if (f == "--rtol") {
      GF_ASSIGN_OR_RETURN(o.rtol, args.Float(f, 0, 1e6));
      o.rtol_set = true;
    } else if (f == "--atol") {
      GF_ASSIGN_OR_RETURN(o.atol, args.Float(f, 0, 1e6));
      o.atol_set = true;
    } else if (f == "--dtype") {
      GF_ASSIGN_OR_RETURN(o.dtype, args.Dtype(f));
    } else if (f == "--threads") {
      GF_ASSIGN_OR_RETURN(int64_t t, args.Int(f, 1, 256));
      o.threads = static_cast<int>(t);
    } else if (f == "--backend") {
      GF_ASSIGN_OR_RETURN(o.backend, args.Backend(f));
    } else if (f == "--check-fusion") {
      o.check_fusion = true;
    } else if (f == "--cpu-codegen") {
      o.cpu_codegen = true;
    } else if (f == "--cuda-graph") {
      o.cuda_graph = true;
    } else if (f == "--emulate-gpu") {
      o.emulate_gpu = true;
    } else if (f == "--tf32") {
      o.tf32 = true;
    } else if (f == "--cuda-attention") {
      GF_ASSIGN_OR_RETURN(o.cuda_attention, args.Value(f));
    } else if (auto fusion_flag = ParseFusionFlag(f, args, &o.fusion); !fusion_flag.ok()) {
      return fusion_flag.status();
    } else if (*fusion_flag) {
      // consumed
    } else if (!f.empty() && f[0] == '-') {
      return InvalidArgument("run: unknown flag '", f, "' (see graphfuse --help)");
    } else if (o.model.empty()) {
      o.model = f;
    } else {
      return InvalidArgument("run: unexpected argument '", f, "' (one model per run)");
    }
  }
  if (o.model.empty()) return InvalidArgument("run: no model given (usage: graphfuse run MODEL.onnx [--data DIR])");
  if ((o.cuda_graph || o.emulate_gpu || o.tf32 || !o.cuda_attention.empty()) && o.backend != "cuda")
    return InvalidArgument("run: --cuda-graph, --emulate-gpu, --tf32 and --cuda-attention need --backend cuda");
  if (!o.data.empty() && !o.shapes.empty())
    return InvalidArgument("run: --shape is for random inputs; with --data the input files give the shapes");
  if (o.cuda_graph && o.emulate_gpu) return InvalidArgument("run: a CUDA graph cannot be emulated (--emulate-gpu)");
  GF_RETURN_IF_ERROR(CheckDtypeBackend("run", o.dtype, o.backend));
  // A narrow plan is compared with the f32 CPU plan within its dtype's tolerance (README,
  // "Accuracy contract"), unless --rtol / --atol say otherwise.
  // f32 GEMMs in TF32: within TF32's tolerance likewise.
  if (o.dtype != DType::kF32 || o.tf32) {
    const double tol = std::max(o.dtype != DType::kF32 ? NarrowTolerance(o.dtype) : 0.0, o.tf32 ? kTf32Tolerance : 0.0);
    if (!o.rtol_set) o.rtol = tol;
    if (!o.atol_set) o.atol = tol;
  }
  if (!o.cuda_attention.empty() && o.cuda_attention != "flash" && o.cuda_attention != "gemms")
    return InvalidArgument("run: --cuda-attention '", o.cuda_attention, "': expected flash or gemms");
  return o;
}

// DIR/input_0.pb, input_1.pb, ... (or output_*), in index order; stops at the first gap.
std::vector<std::string> NumberedFiles(const std::string& dir, const char* prefix) {
  std::vector<std::string> files;
  for (int i = 0;; ++i) {
    const std::string p = StrCat(dir, "/", prefix, "_", i, ".pb");
    if (!std::filesystem::exists(p)) break;
    files.push_back(p);
  }
  return files;
}

struct GroupCheck {
  std::string group, kernel;
  bool ok;
  double max_abs, max_rel;
};

int Fail(const Status& s) { return FailUsage("run", s); }

}  // namespace

int RunModel(Args& args) {
  auto parsed = ParseRun(args);
  if (!parsed.ok()) return Fail(parsed.status());
  const RunOptions o = *parsed;
  TraceRecorder trace;  // --trace: its clock starts before the planning it records
  if (o.backend == "cuda" && !o.emulate_gpu)
    if (Status st = CheckCudaBackend(); !st.ok()) return Fail(st);

  auto onnx = OnnxModel::FromFile(o.model);
  if (!onnx.ok()) return Fail(onnx.status());
  const std::vector<TensorDecl>& decls = (*onnx)->inputs();

  // Inputs: from DIR, else random (seeded, of the shapes --shape gives) so that a model can be
  // smoke-run without data.
  std::vector<Tensor> inputs(decls.size());
  std::vector<std::string> expected_files;
  if (!o.data.empty()) {
    if (!std::filesystem::is_directory(o.data)) return Fail(NotFound("--data '", o.data, "' is not a directory"));
    const std::vector<std::string> files = NumberedFiles(o.data, "input");
    if (files.size() != decls.size())
      return Fail(InvalidArgument(o.data, ": the model takes ", decls.size(), " inputs, found ", files.size(),
                                  " input_<i>.pb files"));
    for (size_t i = 0; i < files.size(); ++i) {
      std::string name;
      auto t = ReadTensorProtoFile(files[i], &name);
      if (!t.ok()) return Fail(t.status());
      // The input the file names, else the one at its position.
      size_t slot = i;
      for (size_t k = 0; k < decls.size(); ++k)
        if (!name.empty() && decls[k].name == name) slot = k;
      inputs[slot] = std::move(*t);
    }
    expected_files = NumberedFiles(o.data, "output");
  } else {
    auto bound = BindShapes(decls, o.shapes);
    if (!bound.ok()) return Fail(bound.status().WithContext(o.model));
    std::mt19937 rng(1);
    std::uniform_real_distribution<double> u(-1, 1);
    for (size_t i = 0; i < decls.size(); ++i) {
      auto t = Tensor::Empty(decls[i].dtype, bound->shapes[i]);
      if (!t.ok()) return Fail(t.status());
      for (int64_t k = 0; k < t->numel(); ++k) t->SetFromDouble(k, IsFloat(decls[i].dtype) ? u(rng) : 0.0);
      inputs[i] = std::move(*t);
    }
    std::fprintf(stderr, "graphfuse run: no --data: running on random inputs in [-1, 1) (nothing to compare)\n");
  }
  std::vector<TensorView> model_views;
  for (const Tensor& t : inputs) model_views.push_back(t.view());
  auto binding = BindInputs(decls, model_views);
  if (!binding.ok())
    return Fail(binding.status().WithContext(o.data.empty() ? o.model : StrCat(o.model, ": --data ", o.data)));

  // The plan for these shapes (and the values of inputs that become shapes), timed.
  const auto planning_start = std::chrono::steady_clock::now();
  auto imported = (*onnx)->Instantiate(*binding);
  if (!imported.ok()) return Fail(imported.status());
  Graph& g = **imported;
  FusionReport fusion;
  PipelineOptions pipeline;
  pipeline.fusion = o.fusion;
  pipeline.fusion_report = &fusion;
  auto target = MakeTarget(o.backend);
  if (!target.ok()) return Fail(target.status());
  auto passes = RunPipeline(g, **target, pipeline);
  if (!passes.ok()) return Fail(passes.status().WithContext(o.model));
  // --dtype bf16 on the CPU: the GEMMs' weights in bf16 (on CUDA the CPU's plan is the f32 reference).
  auto plan = ExecutionPlan::Compile(g, {.bf16_weights = o.backend == "cpu" && o.dtype == DType::kBF16});
  if (!plan.ok()) return Fail(plan.status().WithContext(o.model));
  const double planning_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - planning_start).count();
  // Inputs whose values became shapes are constants of the plan, not its inputs.
  std::vector<TensorView> views;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!binding->values[i]) views.push_back(model_views[i]);

  ThreadPool pool(o.threads);
  CpuContext ctx{&pool};
  std::unique_ptr<CpuCodegen> codegen;
  if (o.cpu_codegen) {
    auto cg = AttachCodegen(ctx);
    if (!cg.ok()) return Fail(cg.status());
    codegen = std::move(*cg);
  }
  std::vector<Tensor> outputs;
  for (const Value* v : g.outputs()) {
    auto t = Tensor::Empty(v->dtype(), v->shape());
    if (!t.ok()) return Fail(t.status());
    outputs.push_back(std::move(*t));
  }
  std::vector<TensorView> out_views;
  for (const Tensor& t : outputs) out_views.push_back(t.view());
  // --check-fusion: every fused kernel's results against its original ops on the same inputs.
  std::vector<GroupCheck> checks;
  ExecutionPlan::StepObserver observer = [&](const Node& n, std::span<const TensorView> in,
                                              std::span<const TensorView> out) -> Status {
    // A fused node's original ops: "reference" (GEMM, norm, softmax, attention kernels) or the
    // elementwise group's own body.
    const Graph* body = n.GetGraph("reference") ? n.GetGraph("reference") : n.GetGraph("body");
    if (!body) return Status::Ok();
    GF_ASSIGN_OR_RETURN(std::vector<Tensor> want, Execute(*body, in, CpuContext{}));
    GroupCheck c{n.name(), n.GetString("kernel_name", ""), true, 0, 0};
    for (size_t k = 0; k < want.size(); ++k) {
      Tensor got = Tensor::Empty(out[k].dtype, out[k].shape).value();
      std::memcpy(got.data(), out[k].data, got.nbytes());
      const OutputReport r = Compare(body->outputs()[k]->name(), got, want[k], o.rtol, o.atol);
      c.ok &= r.ok;
      c.max_abs = std::max(c.max_abs, r.max_abs);
      c.max_rel = std::max(c.max_rel, r.max_rel);
    }
    checks.push_back(c);
    return Status::Ok();
  };
  // --trace: the run of the backend asked for, each kernel timed (graphfuse/profiling.h).
  StepLog steps;
  TracedRun traced;
  traced.graph = &g;
  traced.report = &fusion;
  traced.signature = binding->key;
  traced.target = o.backend;
  traced.planned = true;
  traced.start_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(planning_start.time_since_epoch()).count();
  traced.run_start_ns = SteadyClockNs();
  traced.steps = &steps.steps;
  const std::vector<KernelChoice> choices = (*target)->DescribeKernels(g);
  traced.kernel_choices = &choices;
  RunProfiler* cpu_profiler = !o.trace.empty() && o.backend == "cpu" ? &steps : nullptr;
  if (Status st = (*plan)->Run(views, out_views, ctx, o.check_fusion ? &observer : nullptr, nullptr, cpu_profiler);
      !st.ok())
    return Fail(st.WithContext(o.model));
  traced.end_ns = SteadyClockNs();
  traced.kernels = (*plan)->stats().kernels_launched;

#ifdef GF_HAVE_CUDA
  // --backend cuda: the same plan on the GPU; its outputs are the ones reported, after a
  // comparison with the CPU's on the same inputs. With --dtype bf16 / f16 the GPU runs the model
  // converted to that dtype (planned afresh), against the CPU's f32 plan.
  std::vector<std::string> cuda_lines;
  std::vector<OutputReport> cuda_vs_cpu;
  std::unique_ptr<Graph> narrow;
  if (o.backend == "cuda" && o.dtype != DType::kF32) {
    auto fresh = (*onnx)->Instantiate(*binding);
    if (!fresh.ok()) return Fail(fresh.status());
    auto converted = ConvertPrecision(**fresh, o.dtype);
    if (!converted.ok()) return Fail(converted.status().WithContext(StrCat(o.model, ": --dtype ", DTypeName(o.dtype))));
    narrow = std::move(*converted);
    PipelineOptions narrow_pipeline;
    narrow_pipeline.fusion = o.fusion;
    if (auto r = RunPipeline(*narrow, **target, narrow_pipeline); !r.ok())
      return Fail(r.status().WithContext(StrCat(o.model, ": --dtype ", DTypeName(o.dtype))));
  }
  if (o.backend == "cuda") {
    cuda::CudaExecOptions co;
    co.cuda_graph = o.cuda_graph;
    co.emulate = o.emulate_gpu;
    co.plan.tf32 = o.tf32;
    if (!o.cuda_attention.empty()) {
      auto form = cuda::ParsePrefillAttention(o.cuda_attention);
      if (!form.ok()) return Fail(form.status().WithContext("run: --cuda-attention"));
      co.plan.prefill_attention = *form;
    }
    traced.start_ns = SteadyClockNs();  // the trace's "plan": the GPU plan's compilation
    auto ex = cuda::CudaExecutor::Create(narrow ? *narrow : g, co);
    if (!ex.ok()) return Fail(ex.status().WithContext(StrCat(o.model, ": --backend cuda")));
    traced.run_start_ns = SteadyClockNs();
    auto gpu = (*ex)->Run(views);
    if (!gpu.ok()) return Fail(gpu.status().WithContext(StrCat(o.model, ": --backend cuda")));
    traced.end_ns = SteadyClockNs();
    traced.kernels = (*ex)->stats().launches;
    if (narrow) {
      traced.graph = narrow.get();
      traced.report = nullptr;
    }
    if (!o.trace.empty()) {
      // Device times: the steps replayed one by one between CUDA events (an emulated plan has
      // none; its run is one host-timed step).
      auto device = (*ex)->DeviceSteps(traced.run_start_ns);
      if (device.ok()) {
        steps.steps = std::move(*device);
      } else {
        steps.steps.push_back(StepTiming{nullptr, "run", traced.run_start_ns, traced.end_ns - traced.run_start_ns});
      }
    }
    for (size_t i = 0; i < outputs.size(); ++i)
      cuda_vs_cpu.push_back(Compare(g.outputs()[i]->name(), (*gpu)[i], outputs[i], o.rtol, o.atol));
    const cuda::CudaExecStats& cs = (*ex)->stats();
    cuda_lines.push_back(StrCat("cuda", narrow ? StrCat(" (", DTypeName(o.dtype), ")") : "", ": ", cs.launches,
                                " launches per run (", cs.generated, " generated kernels, ",
                                cs.cublas, " cuBLAS calls, ", cs.host_fallbacks, " on the host)",
                                o.cuda_graph ? ", replayed as one CUDA graph" : "",
                                o.tf32 ? ", f32 GEMMs in TF32" : "",
                                o.emulate_gpu ? "; emulated on the host, no GPU used" : ""));
    for (const std::string& l : (*ex)->describe()) cuda_lines.push_back("  " + l);
    outputs = std::move(*gpu);
  }
  for (const std::string& l : cuda_lines) std::printf("%s\n", l.c_str());
  for (const OutputReport& r : cuda_vs_cpu)
    std::printf("cuda vs cpu  %-24s max |err| %.3g  max rel %.3g  %s\n", r.name.c_str(), r.max_abs, r.max_rel,
                r.ok ? "ok" : "DIFFERS");
#endif

  // Any other target: its executable on the same inputs, compared with the CPU's outputs.
  std::vector<OutputReport> target_vs_cpu;
  if (o.backend != "cpu" && o.backend != "cuda") {
    auto ex = (*target)->Compile(std::shared_ptr<const Graph>(&g, [](const Graph*) {}));
    if (!ex.ok()) return Fail(ex.status().WithContext(StrCat(o.model, ": --backend ", o.backend)));
    std::vector<Tensor> got;
    std::vector<TensorView> got_views;
    for (const Tensor& t : outputs) {
      got.push_back(Tensor::Empty(t.dtype(), t.shape()).value());
      got_views.push_back(got.back().view());
    }
    traced.run_start_ns = SteadyClockNs();
    if (Status st = o.trace.empty() ? (*ex)->Run(views, got_views) : (*ex)->RunProfiled(views, got_views, steps);
        !st.ok())
      return Fail(st.WithContext(StrCat(o.model, ": --backend ", o.backend)));
    traced.end_ns = SteadyClockNs();
    traced.kernels = (*ex)->launches_per_run();
    for (size_t i = 0; i < outputs.size(); ++i)
      target_vs_cpu.push_back(Compare(g.outputs()[i]->name(), got[i], outputs[i], o.rtol, o.atol));
    std::printf("%s: %lld launches per run\n", o.backend.c_str(), static_cast<long long>((*ex)->launches_per_run()));
    for (const OutputReport& r : target_vs_cpu)
      std::printf("%s vs cpu  %-24s max |err| %.3g  max rel %.3g  %s\n", o.backend.c_str(), r.name.c_str(), r.max_abs,
                  r.max_rel, r.ok ? "ok" : "DIFFERS");
    outputs = std::move(got);
  }

  std::vector<OutputReport> reports;
  bool all_ok = true;
  for (const OutputReport& r : target_vs_cpu) all_ok &= r.ok;
#ifdef GF_HAVE_CUDA
  for (const OutputReport& r : cuda_vs_cpu) all_ok &= r.ok;
#endif
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string name = g.outputs()[i]->name();
    if (i >= expected_files.size()) {
      reports.push_back(OutputReport{name});
      continue;
    }
    auto want = ReadTensorProtoFile(expected_files[i]);
    if (!want.ok()) return Fail(want.status());
    const Tensor& got = outputs[i];
    if (want->shape() != got.shape())
      return Fail(InvalidArgument(expected_files[i], ": expected output '", name, "' has shape ",
                                  ShapeToString(want->shape()), ", the model gives ", ShapeToString(got.shape())));
    reports.push_back(Compare(name, got, *want, o.rtol, o.atol));
    all_ok &= reports.back().ok;
  }

  const ExecStats& st = (*plan)->stats();
  std::printf("model %s: %lld kernels per run unfused, %lld %s; peak activations %.1f KiB (%.1f KiB without reuse)\n",
              o.model.c_str(), static_cast<long long>(fusion.kernels_before), static_cast<long long>(st.kernels_launched),
              o.fusion.enabled ? "fused" : "run (--no-fuse)", st.peak_activation_bytes / 1024.0,
              st.activation_bytes_no_reuse / 1024.0);
  std::printf("planning: %.1f ms for %s\n", planning_ms, binding->key.c_str());
  if (codegen) std::printf("native loops: %s\n", CodegenSummary(*codegen).c_str());
  if (o.check_fusion) {
    const GroupCheck* first_bad = nullptr;
    for (const GroupCheck& c : checks)
      if (!c.ok && !first_bad) first_bad = &c;
    std::printf("check-fusion: %zu fused kernels checked against their unfused ops: %s\n", checks.size(),
                first_bad ? StrCat("first difference in ", first_bad->group, " (", first_bad->kernel, "): max |err| ",
                                   first_bad->max_abs, ", max rel ", first_bad->max_rel)
                                .c_str()
                          : "all agree");
    all_ok &= first_bad == nullptr;
  }
  std::printf("%-24s %12s %12s %10s  %s\n", "output", "max |err|", "max rel err", "mismatch", "");
  for (const OutputReport& r : reports) {
    if (!r.compared) {
      std::printf("%-24s %12s %12s %10s  %s\n", r.name.c_str(), "-", "-", "-", "no reference");
      continue;
    }
    std::printf("%-24s %12.3g %12.3g %10lld  %s\n", r.name.c_str(), r.max_abs, r.max_rel,
                static_cast<long long>(r.mismatches), r.ok ? "ok" : "DIFFERS");
  }
  if (!o.trace.empty()) {
    trace.Record(traced);
    if (Status st = trace.WriteFile(o.trace); !st.ok()) return Fail(st);
    std::printf("trace: %s (%lld events; open in https://ui.perfetto.dev or chrome://tracing)\n", o.trace.c_str(),
                static_cast<long long>(trace.events()));
  }
  if (!o.json.empty()) {
    Json j;
    j.BeginObject().Key("command").Str("run").Key("model").Str(o.model);
    AddFusionJson(j, fusion);
    j.Key("signature").Str(binding->key).Key("planning_ms").Num(planning_ms);
    if (o.check_fusion) {
      j.Key("check_fusion").BeginArray();
      for (const GroupCheck& c : checks)
        j.BeginObject().Key("group").Str(c.group).Key("kernel").Str(c.kernel).Key("max_abs_err").Num(c.max_abs)
            .Key("max_rel_err").Num(c.max_rel).Key("ok").Bool(c.ok).EndObject();
      j.EndArray();
    }
    j.Key("peak_activation_bytes").Int(st.peak_activation_bytes);
    j.Key("outputs").BeginArray();
    for (const OutputReport& r : reports) {
      j.BeginObject().Key("name").Str(r.name);
      if (r.compared) j.Key("max_abs_err").Num(r.max_abs).Key("max_rel_err").Num(r.max_rel).Key("ok").Bool(r.ok);
      j.EndObject();
    }
    j.EndArray().EndObject();
    if (!j.WriteFile(o.json)) return Fail(InvalidArgument("cannot write --json file '", o.json, "'"));
  }
  return all_ok ? kExitOk : kExitMismatch;
}

}  // namespace graphfuse::cli
