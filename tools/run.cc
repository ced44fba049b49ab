// `graphfuse run MODEL.onnx [--data DIR | --shape NAME=D0xD1...] ...`: plans a model for the
// inputs' shapes, runs it on the target --backend names (beside the reference, the CPU in f32,
// when that is another) and compares its outputs with the expected ones
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
#include "graphfuse/model.h"
#include "graphfuse/profiling.h"
#include "fusion_report.h"
#include "core/json.h"
#include "onnx/import.h"
#include "runtime/signature.h"
#include "cpu/executor.h"

namespace graphfuse::cli {
namespace {

struct RunOptions {
  std::string model, data, json, trace, backend = "cpu";
  // --threads, --cpu-codegen; --cuda-graph, --emulate-gpu, --tf32, --cuda-attention (the
  // target refuses another's options).
  TargetOptions target;
  double rtol = kDefaultRtol, atol = kDefaultAtol;
  bool check_fusion = false;
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
      o.target.cpu.threads = static_cast<int>(t);
    } else if (f == "--backend") {
      GF_ASSIGN_OR_RETURN(o.backend, args.Backend(f));
    } else if (f == "--check-fusion") {
      o.check_fusion = true;
    } else if (f == "--cpu-codegen") {
      o.target.cpu.codegen = true;
    } else if (f == "--cpu-gemm") {
      GF_ASSIGN_OR_RETURN(o.target.cpu.gemm, args.CpuGemm(f));
    } else if (f == "--cuda-graph") {
      o.target.cuda.graph = true;
    } else if (f == "--emulate-gpu") {
      o.target.cuda.emulate = true;
    } else if (f == "--tf32") {
      o.target.cuda.tf32 = true;
    } else if (f == "--cuda-attention") {
      GF_ASSIGN_OR_RETURN(o.target.cuda.prefill_attention, args.Value(f));
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
  if (!o.data.empty() && !o.shapes.empty())
    return InvalidArgument("run: --shape is for random inputs; with --data the input files give the shapes");
  // A narrow plan is compared with the f32 CPU plan within its dtype's tolerance (README,
  // "Accuracy contract"), unless --rtol / --atol say otherwise.
  // f32 GEMMs in TF32: within TF32's tolerance likewise.
  if (o.dtype != DType::kF32 || o.target.cuda.tf32) {
    const double tol =
        std::max(o.dtype != DType::kF32 ? NarrowTolerance(o.dtype) : 0.0, o.target.cuda.tf32 ? kTf32Tolerance : 0.0);
    if (!o.rtol_set) o.rtol = tol;
    if (!o.atol_set) o.atol = tol;
  }
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

// The model's declared inputs as the signature binder reads them.
std::vector<TensorDecl> Decls(const std::vector<TensorInfo>& infos) {
  std::vector<TensorDecl> decls;
  for (const TensorInfo& t : infos) {
    TensorDecl d{t.name, t.dtype, {}, t.values_shape_plan, t.value_use};
    for (size_t k = 0; k < t.shape.size(); ++k) d.dims.push_back(DeclDim{t.shape[k], t.dim_params[k]});
    decls.push_back(std::move(d));
  }
  return decls;
}

// The inputs of the run: DIR/input_<i>.pb, or random ones (seeded, of the shapes --shape
// gives) so that a model can be smoke-run without data; `expected` gets DIR/output_<i>.pb.
Result<std::vector<Tensor>> LoadInputs(const RunOptions& o, const std::vector<TensorInfo>& declared,
                                       std::vector<std::string>* expected) {
  std::vector<Tensor> inputs(declared.size());
  if (!o.data.empty()) {
    if (!std::filesystem::is_directory(o.data)) return NotFound("--data '", o.data, "' is not a directory");
    const std::vector<std::string> files = NumberedFiles(o.data, "input");
    if (files.size() != declared.size())
      return InvalidArgument(o.data, ": the model takes ", declared.size(), " inputs, found ", files.size(),
                             " input_<i>.pb files");
    for (size_t i = 0; i < files.size(); ++i) {
      std::string name;
      GF_ASSIGN_OR_RETURN(Tensor t, ReadTensorProtoFile(files[i], &name));
      // The input the file names, else the one at its position.
      size_t slot = i;
      for (size_t k = 0; k < declared.size(); ++k)
        if (!name.empty() && declared[k].name == name) slot = k;
      inputs[slot] = std::move(t);
    }
    *expected = NumberedFiles(o.data, "output");
    return inputs;
  }
  const std::vector<TensorDecl> decls = Decls(declared);
  auto bound = BindShapes(decls, o.shapes);
  if (!bound.ok()) return bound.status().WithContext(o.model);
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> u(-1, 1);
  for (size_t i = 0; i < decls.size(); ++i) {
    GF_ASSIGN_OR_RETURN(inputs[i], Tensor::Empty(decls[i].dtype, bound->shapes[i]));
    for (int64_t k = 0; k < inputs[i].numel(); ++k)
      inputs[i].SetFromDouble(k, IsFloat(decls[i].dtype) ? u(rng) : 0.0);
  }
  std::fprintf(stderr, "graphfuse run: no --data: running on random inputs in [-1, 1) (nothing to compare)\n");
  return inputs;
}

// --check-fusion: every fused kernel's results against its original ops on the same inputs, in
// a run of `model` that shows each node's buffers.
Result<std::vector<GroupCheck>> CheckFusion(const CompiledModel& model, std::span<const TensorView> inputs,
                                            const RunOptions& o) {
  GF_ASSIGN_OR_RETURN(std::shared_ptr<const Plan> plan, model.PlanFor(inputs));
  std::vector<Tensor> outputs;
  std::vector<TensorView> views;
  for (const TensorInfo& t : plan->outputs()) {
    GF_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(t.dtype, t.shape));
    outputs.push_back(std::move(out));
    views.push_back(outputs.back().view());
  }
  std::vector<GroupCheck> checks;
  const NodeObserver observer = [&](const Node& n, std::span<const TensorView> in,
                                    std::span<const TensorView> out) -> Status {
    // A fused node's original ops: "reference" (GEMM, norm, softmax, attention kernels) or the
    // elementwise group's own body.
    const Graph* body = n.GetGraph("reference") ? n.GetGraph("reference") : n.GetGraph("body");
    if (!body) return Status::Ok();
    GF_ASSIGN_OR_RETURN(std::vector<Tensor> want, Execute(*body, in, CpuContext{}));
    GroupCheck c{n.name(), n.GetString("kernel_name", ""), true, 0, 0};
    for (size_t k = 0; k < want.size(); ++k) {
      GF_ASSIGN_OR_RETURN(Tensor got, Tensor::Empty(out[k].dtype, out[k].shape));
      std::memcpy(got.data(), out[k].data, got.nbytes());
      const OutputReport r = Compare(body->outputs()[k]->name(), got, want[k], o.rtol, o.atol);
      c.ok &= r.ok;
      c.max_abs = std::max(c.max_abs, r.max_abs);
      c.max_rel = std::max(c.max_rel, r.max_rel);
    }
    checks.push_back(c);
    return Status::Ok();
  };
  GF_RETURN_IF_ERROR(model.RunObserved(inputs, views, observer));
  return checks;
}

}  // namespace

int RunModel(Args& args) {
  auto parsed = ParseRun(args);
  if (!parsed.ok()) return Fail(parsed.status());
  const RunOptions o = *parsed;
  TraceRecorder trace;  // --trace: its clock starts before the planning it records
  auto target = MakeCommandTarget(o.backend, o.target, o.dtype);
  if (!target.ok()) return Fail(target.status());
  // A target other than the reference runs beside the reference (the CPU in f32, with the same
  // threads) on the same inputs, and its outputs are compared with the reference's.
  const bool beside_reference = !IsReferenceKind(**target);
  auto model = Model::FromOnnxFile(o.model);
  if (!model.ok()) return Fail(model.status());
  std::vector<std::string> expected_files;
  auto inputs = LoadInputs(o, model->inputs(), &expected_files);
  if (!inputs.ok()) return Fail(inputs.status());
  std::vector<TensorView> views;
  for (const Tensor& t : *inputs) views.push_back(t.view());

  CompileOptions compile;
  compile.fusion = o.fusion;
  std::unique_ptr<CompiledModel> reference;
  if (beside_reference) {
    // The same loaded model (its weights are shared, not read again).
    auto ref = CompiledModel::Compile(*model, MakeReferenceTarget(o.target), compile);
    if (!ref.ok()) return Fail(ref.status().WithContext(o.model));
    reference = std::move(*ref);
  }
  auto compiled = CompiledModel::Compile(std::move(*model), *target, compile);
  if (!compiled.ok()) return Fail(compiled.status().WithContext(o.model));
  const CompiledModel& cm = **compiled;
  // The plan for these shapes (and the values of inputs that become shapes); a bad input is
  // refused here, naming the input and the dim.
  auto plan = cm.PlanFor(views);
  if (!plan.ok())
    return Fail(plan.status().WithContext(o.data.empty() ? o.model : StrCat(o.model, ": --data ", o.data)));

  // --check-fusion: in a run that shows each node, the target's own, or the reference's where
  // the target's kernels do not run node by node on the host.
  std::vector<GroupCheck> checks;
  if (o.check_fusion) {
    auto c = CheckFusion(cm, views, o);
    if (!c.ok() && c.status().code() == StatusCode::kUnimplemented && reference) c = CheckFusion(*reference, views, o);
    if (!c.ok()) return Fail(c.status().WithContext(o.model));
    checks = std::move(*c);
  }
  auto outputs = cm.Run(views, o.trace.empty() ? nullptr : &trace);
  if (!outputs.ok()) return Fail(outputs.status().WithContext(StrCat(o.model, ": --backend ", o.backend)));
  const Plan& p = **plan;

  // Beside the reference: the target's description, then its outputs against the reference's.
  std::vector<OutputReport> vs_reference;
  bool all_ok = true;
  if (reference) {
    auto want = reference->Run(views);
    if (!want.ok()) return Fail(want.status().WithContext(o.model));
    const std::vector<std::string> lines = p.describe();
    std::printf("%s%s: %s\n", o.backend.c_str(), o.dtype != DType::kF32 ? StrCat(" (", DTypeName(o.dtype), ")").c_str() : "",
                lines.empty() ? StrCat(p.launches_per_run(), " launches per run").c_str() : lines[0].c_str());
    for (size_t i = 1; i < lines.size(); ++i) std::printf("%s\n", lines[i].c_str());
    const std::string reference_name(MakeReferenceTarget()->name());
    for (size_t i = 0; i < outputs->size(); ++i) {
      vs_reference.push_back(Compare(p.outputs()[i].name, (*outputs)[i], (*want)[i], o.rtol, o.atol));
      const OutputReport& r = vs_reference.back();
      std::printf("%s vs %s  %-24s max |err| %.3g  max rel %.3g  %s\n", o.backend.c_str(),
                  reference_name.c_str(), r.name.c_str(), r.max_abs, r.max_rel,
                  r.ok ? "ok" : "DIFFERS");
      all_ok &= r.ok;
    }
  }

  std::vector<OutputReport> reports;
  for (size_t i = 0; i < outputs->size(); ++i) {
    const std::string& name = p.outputs()[i].name;
    if (i >= expected_files.size()) {
      reports.push_back(OutputReport{name});
      continue;
    }
    auto want = ReadTensorProtoFile(expected_files[i]);
    if (!want.ok()) return Fail(want.status());
    const Tensor& got = (*outputs)[i];
    if (want->shape() != got.shape())
      return Fail(InvalidArgument(expected_files[i], ": expected output '", name, "' has shape ",
                                  ShapeToString(want->shape()), ", the model gives ", ShapeToString(got.shape())));
    reports.push_back(Compare(name, got, *want, o.rtol, o.atol));
    all_ok &= reports.back().ok;
  }

  const FusionReport& fusion = p.report();
  const ExecutableStats st = p.stats();
  const double planning_ms = p.planning_time().total_ms();
  std::printf("model %s: %lld kernels per run unfused, %lld %s; peak activations %.1f KiB (%.1f KiB without reuse)\n",
              o.model.c_str(), static_cast<long long>(fusion.kernels_before), static_cast<long long>(st.launches),
              o.fusion.enabled ? "fused" : "run (--no-fuse)", st.activation_bytes / 1024.0,
              st.activation_bytes_no_reuse / 1024.0);
  std::printf("planning: %.1f ms for %s\n", planning_ms, p.signature().c_str());
  if (st.tuned_classes > 0)
    std::printf("  of which %.1f ms timing the GEMM engines of %lld shape classes (once per machine: cached)\n",
                st.tuning_ms, static_cast<long long>(st.tuned_classes));
  if (!reference)
    for (const std::string& l : p.describe()) std::printf("%s\n", l.c_str());
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
    if (Status ws = trace.WriteFile(o.trace); !ws.ok()) return Fail(ws);
    std::printf("trace: %s (%lld events; open in https://ui.perfetto.dev or chrome://tracing)\n", o.trace.c_str(),
                static_cast<long long>(trace.events()));
  }
  if (!o.json.empty()) {
    Json j;
    j.BeginObject().Key("command").Str("run").Key("model").Str(o.model);
    AddFusionJson(j, fusion);
    j.Key("signature").Str(p.signature()).Key("planning_ms").Num(planning_ms);
    if (o.check_fusion) {
      j.Key("check_fusion").BeginArray();
      for (const GroupCheck& c : checks)
        j.BeginObject().Key("group").Str(c.group).Key("kernel").Str(c.kernel).Key("max_abs_err").Num(c.max_abs)
            .Key("max_rel_err").Num(c.max_rel).Key("ok").Bool(c.ok).EndObject();
      j.EndArray();
    }
    j.Key("peak_activation_bytes").Int(st.activation_bytes);
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
