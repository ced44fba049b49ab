// `graphfuse explain MODEL.onnx`: the fusion plan without running anything: groups, their
// member nodes and kernel names, every refused fusion with its reason code, and which engine
// runs each GEMM on the CPU and why; with --cuda-src, how each node would run on a GPU and the
// CUDA source generated for it (no GPU needed).
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "cli_common.h"
#include "fusion_report.h"
#include "ir/text.h"
#include "onnx/import.h"
#include "passes/convert_precision.h"
#include "passes/pipeline.h"
#include "runtime/signature.h"

namespace graphfuse::cli {

int Explain(Args& args) {
  std::string model, dot, json, cuda_src;
  bool print_ir = false, list_passes = false;
  PassHooks hooks;
  DType dtype = DType::kF32;  // what the model computes in (--dtype): converted before planning
  CpuGemmEngine cpu_gemm = CpuGemmEngine::kAuto;  // --cpu-gemm: the CPU plan's GEMM engine
  FusionOptions fusion;
  std::map<std::string, Shape> shapes;
  auto fail = [](const Status& s) { return FailUsage("explain", s); };
  while (!args.Done()) {
    const std::string f = args.Next();
    if (f == "--shape") {
      auto v = args.Value(f);
      if (!v.ok()) return fail(v.status());
      if (Status st = ParseShapeFlag(*v, &shapes); !st.ok()) return fail(st);
    } else if (f == "--dot" || f == "--json" || f == "--cuda-src") {
      auto v = f == "--cuda-src" ? args.Value(f) : args.OutputFile(f);
      if (!v.ok()) return fail(v.status());
      (f == "--dot" ? dot : f == "--json" ? json : cuda_src) = *v;
    } else if (f == "--dtype") {
      auto v = args.Dtype(f);
      if (!v.ok()) return fail(v.status());
      dtype = *v;
    } else if (f == "--cpu-gemm") {
      auto v = args.CpuGemm(f);
      if (!v.ok()) return fail(v.status());
      cpu_gemm = *v;
    } else if (f == "--print-ir") {
      print_ir = true;
    } else if (f == "--passes") {
      list_passes = true;
    } else if (f.rfind("--print-ir-before", 0) == 0 || f.rfind("--print-ir-after", 0) == 0) {
      // --print-ir-after=NAME or --print-ir-after NAME (a pass's name, or all); repeatable.
      const bool before = f.rfind("--print-ir-before", 0) == 0;
      const std::string flag = before ? "--print-ir-before" : "--print-ir-after";
      std::string name;
      if (f.size() > flag.size() && f[flag.size()] == '=') {
        name = f.substr(flag.size() + 1);
      } else if (f == flag) {
        auto v = args.Value(f);
        if (!v.ok()) return fail(v.status());
        name = *v;
      } else {
        return fail(InvalidArgument("unknown flag '", f, "' (see graphfuse --help)"));
      }
      if (Status known = CheckPassName(name); !known.ok()) return fail(known.WithContext(flag));
      (before ? hooks.print_ir_before : hooks.print_ir_after).insert(name);
    } else if (auto flag = ParseFusionFlag(f, args, &fusion); !flag.ok()) {
      return fail(flag.status());
    } else if (*flag) {
      // consumed
    } else if (!f.empty() && f[0] == '-') {
      return fail(InvalidArgument("unknown flag '", f, "' (see graphfuse --help)"));
    } else if (model.empty()) {
      model = f;
    } else {
      return fail(InvalidArgument("unexpected argument '", f, "'"));
    }
  }
  if (list_passes) {
    std::printf("the passes, in pipeline order (fusion: only when fusion is on; the others also in the unfused plan):\n");
    for (const Pass& p : AllPasses())
      std::printf("  %-26s %-7s %s\n", p.name, p.fusion_only ? "fusion" : "always", p.what);
    if (model.empty()) return kExitOk;
  }
  if (model.empty()) return fail(InvalidArgument("no model given (usage: graphfuse explain MODEL.onnx)"));
  // The plan explained is the CPU's, unless --cuda-src asks for the GPU's (planned as the cuda
  // target plans, no device needed); --dtype means what it means to `run` on that target (on the
  // CPU: f32 with bf16 GEMM weights).
  TargetOptions target_options;
  target_options.cuda.emulate = !cuda_src.empty();
  if (cuda_src.empty()) target_options.cpu.gemm = cpu_gemm;
  else if (cpu_gemm != CpuGemmEngine::kAuto)
    return fail(InvalidArgument("--cpu-gemm picks the CPU's GEMM engine; --cuda-src explains the GPU's plan"));
  auto target = MakeCommandTarget(cuda_src.empty() ? "cpu" : "cuda", target_options, dtype);
  if (!target.ok() && cuda_src.empty())
    return fail(InvalidArgument(target.status().message(), "; for the GPU's plan, add --cuda-src DIR"));
  if (!target.ok()) return fail(target.status().WithContext("--cuda-src"));
  InputBinding binding;
  auto g = ImportOnnxFileWithShapes(model, shapes, &binding);
  if (!g.ok()) return fail(g.status());
  const DType graph_dtype = (*target)->graph_dtype();
  if (graph_dtype != DType::kF32) {
    auto converted = ConvertPrecision(**g, graph_dtype);
    if (!converted.ok()) return fail(converted.status().WithContext(StrCat(model, ": --dtype ", DTypeName(dtype))));
    *g = std::move(*converted);
  }
  FusionReport report;
  PipelineOptions pipeline;
  pipeline.fusion = fusion;
  pipeline.fusion_report = &report;
  pipeline.print_after_each = print_ir ? stdout : nullptr;
  pipeline.hooks = hooks;
  auto passes = RunPipeline(**g, **target, pipeline);
  if (!passes.ok()) return fail(passes.status().WithContext(model));
  std::printf("model %s%s%s\n", model.c_str(), shapes.empty() ? "" : StrCat(" for ", binding.key).c_str(),
              dtype == DType::kF32       ? ""
              : graph_dtype == DType::kF32 ? ", computing in f32 with bf16 GEMM weights"
                                           : StrCat(", computing in ", DTypeName(dtype)).c_str());
  PrintFusionReport(stdout, report);
  // How the target's kernels choose where they choose (the CPU: each GEMM's engine).
  const std::vector<KernelChoice> choices = (*target)->DescribeKernels(**g);
  if (!choices.empty()) {
    std::string name((*target)->name());
    for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    std::printf("\nhow the %s runs the GEMMs:\n", name.c_str());
  }
  for (const KernelChoice& c : choices) std::printf("  %-28s %-15s %s\n", c.node.c_str(), c.op.c_str(), c.how.c_str());
  if (!dot.empty()) {
    std::ofstream f(dot);
    f << FusionDot(**g, report);
    if (!f) return fail(InvalidArgument("cannot write --dot file '", dot, "'"));
  }
  if (!cuda_src.empty()) {
    auto lines = (*target)->WriteKernelSources(**g, cuda_src);
    if (!lines.ok()) return fail(lines.status().WithContext("--cuda-src"));
    std::printf("\nCUDA plan (sources in %s):\n", cuda_src.c_str());
    for (size_t i = 0; i < lines->size(); ++i)
      std::printf(i + 1 < lines->size() ? "  %s\n" : "%s\n", (*lines)[i].c_str());
  }
  if (!json.empty()) {
    Json j;
    j.BeginObject().Key("command").Str("explain").Key("model").Str(model);
    if (!shapes.empty()) j.Key("signature").Str(binding.key);
    j.Key("dtype").Str(DTypeName(dtype)).Key("target").Str(std::string((*target)->name()));
    AddFusionJson(j, report);
    // Each pass that ran: what it reports it changed, and its time (with the verifier after it).
    j.Key("passes").BeginArray();
    for (const PassRecord& r : *passes)
      j.BeginObject().Key("name").Str(r.pass).Key("changes").Int(r.changes).Key("ms").Num(r.ms).EndObject();
    j.EndArray();
    j.Key("kernel_choices").BeginArray();
    for (const KernelChoice& c : choices)
      j.BeginObject().Key("node").Str(c.node).Key("op").Str(c.op).Key("how").Str(c.how).EndObject();
    j.EndArray();
    j.EndObject();
    if (!j.WriteFile(json)) return fail(InvalidArgument("cannot write --json file '", json, "'"));
  }
  return kExitOk;
}

}  // namespace graphfuse::cli
