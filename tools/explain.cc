// `graphfuse explain MODEL.onnx`: the fusion plan without running anything: groups, their
// member nodes and kernel names, every refused fusion with its reason code.
#include <cstdio>
#include <fstream>
#include <string>

#include "cli_common.h"
#include "fusion_report.h"
#include "ir/text.h"
#include "onnx/import.h"
#include "passes/pipeline.h"

namespace graphfuse::cli {

int Explain(Args& args) {
  std::string model, dot, json;
  bool print_ir = false;
  FusionOptions fusion;
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "graphfuse explain: %s\n", s.message().c_str());
    return kExitBadInput;
  };
  while (!args.Done()) {
    const std::string f = args.Next();
    if (f == "--dot" || f == "--json") {
      auto v = args.Value(f);
      if (!v.ok()) return fail(v.status());
      (f == "--dot" ? dot : json) = *v;
    } else if (f == "--print-ir") {
      print_ir = true;
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
  if (model.empty()) return fail(InvalidArgument("no model given (usage: graphfuse explain MODEL.onnx)"));
  auto g = ImportOnnxFile(model);
  if (!g.ok()) return fail(g.status());
  FusionReport report;
  PipelineOptions pipeline;
  pipeline.fusion = fusion;
  pipeline.fusion_report = &report;
  pipeline.print_after_each = print_ir ? stdout : nullptr;
  auto passes = RunPipeline(**g, pipeline);
  if (!passes.ok()) return fail(passes.status().WithContext(model));
  std::printf("model %s\n", model.c_str());
  PrintFusionReport(stdout, report);
  if (!dot.empty()) {
    std::ofstream f(dot);
    f << FusionDot(**g, report);
    if (!f) return fail(InvalidArgument("cannot write --dot file '", dot, "'"));
  }
  if (!json.empty()) {
    Json j;
    j.BeginObject().Key("command").Str("explain").Key("model").Str(model);
    AddFusionJson(j, report);
    j.EndObject();
    if (!j.WriteFile(json)) return fail(InvalidArgument("cannot write --json file '", json, "'"));
  }
  return kExitOk;
}

}  // namespace graphfuse::cli
