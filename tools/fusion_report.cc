#include "fusion_report.h"

#include <map>
#include <set>

#include "cli_common.h"

namespace graphfuse::cli {

void PrintFusionReport(FILE* f, const FusionReport& r) {
  std::fprintf(f, "kernels per run: %lld unfused -> %lld fused (%zu fused groups)\n",
               static_cast<long long>(r.kernels_before), static_cast<long long>(r.kernels_after), r.groups.size());
  for (const FusedGroupInfo& g : r.groups) {
    std::fprintf(f, "  %-10s %-12s %zu ops  %s\n", g.name.c_str(), g.kind.c_str(), g.nodes.size(), g.kernel_name.c_str());
    std::string members;
    for (const std::string& n : g.nodes) members += (members.empty() ? "" : ", ") + n;
    std::fprintf(f, "             nodes: %s\n", members.c_str());
    if (!g.epilogue.empty()) std::fprintf(f, "             epilogue: %s\n", g.epilogue.c_str());
  }
  if (r.refusals.empty()) return;
  std::map<std::string, int> by_code;
  for (const FusionRefusal& x : r.refusals) ++by_code[x.code];
  std::fprintf(f, "refused fusions: %zu (", r.refusals.size());
  bool first = true;
  for (const auto& [code, n] : by_code) {
    std::fprintf(f, "%s%s %d", first ? "" : ", ", code.c_str(), n);
    first = false;
  }
  std::fprintf(f, ")\n");
  for (const FusionRefusal& x : r.refusals)
    std::fprintf(f, "  %-20s %s -> %s: %s\n", x.code.c_str(), x.producer.c_str(), x.consumer.c_str(), x.message.c_str());
}

void AddFusionJson(Json& j, const FusionReport& r) {
  j.Key("kernels_unfused").Int(r.kernels_before).Key("kernels_fused").Int(r.kernels_after);
  j.Key("groups").BeginArray();
  for (const FusedGroupInfo& g : r.groups) {
    j.BeginObject().Key("name").Str(g.name).Key("kind").Str(g.kind).Key("kernel").Str(g.kernel_name);
    if (!g.epilogue.empty()) j.Key("epilogue").Str(g.epilogue);
    j.Key("nodes").BeginArray();
    for (const std::string& n : g.nodes) j.Str(n);
    j.EndArray().EndObject();
  }
  j.EndArray();
  j.Key("refusals").BeginArray();
  for (const FusionRefusal& x : r.refusals)
    j.BeginObject().Key("producer").Str(x.producer).Key("consumer").Str(x.consumer).Key("code").Str(x.code)
        .Key("message").Str(x.message).EndObject();
  j.EndArray();
}

namespace {
std::string DotId(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}
}  // namespace

std::string FusionDot(const Graph& g, const FusionReport& r) {
  std::string s = "digraph " + DotId(g.name()) + " {\n  rankdir=TB;\n  node [shape=box, fontsize=10];\n";
  // Every node of the fused graph; fused nodes expand into a cluster of their body's ops.
  std::map<const Value*, std::string> producer_id;  // value -> dot node that computes it
  int cluster = 0;
  for (const Value* in : g.inputs()) {
    s += StrCat("  ", DotId("in:" + in->name()), " [shape=ellipse, label=", DotId(in->name() + "\\n" + in->TypeString()), "];\n");
    producer_id[in] = "in:" + in->name();
  }
  for (const auto& n : g.nodes()) {
    // A fused node's original ops: its "reference" graph, or an elementwise group's body.
    const Graph* body = n->GetGraph("reference") ? n->GetGraph("reference") : n->GetGraph("body");
    if (body) {
      s += StrCat("  subgraph cluster_", cluster++, " {\n    label=", DotId(n->name() + ": " + n->GetString("kernel_name", "")),
                  "; style=filled; color=lightblue;\n");
      std::map<const Value*, std::string> inner;
      for (const auto& bn : body->nodes()) {
        const std::string id = n->name() + "/" + bn->name();
        s += StrCat("    ", DotId(id), " [label=", DotId(bn->op()), "];\n");
        for (const Value* o : bn->outputs()) inner[o] = id;
      }
      s += "  }\n";
      for (const auto& bn : body->nodes())
        for (const Value* in : bn->inputs()) {
          const std::string to = n->name() + "/" + bn->name();
          if (inner.count(in)) {
            s += StrCat("  ", DotId(inner.at(in)), " -> ", DotId(to), ";\n");
          } else {  // a body input: the fused node's input at the same position
            for (size_t k = 0; k < body->inputs().size(); ++k)
              if (body->inputs()[k] == in && producer_id.count(n->input(k)))
                s += StrCat("  ", DotId(producer_id.at(n->input(k))), " -> ", DotId(to), ";\n");
          }
        }
      for (size_t k = 0; k < n->outputs().size(); ++k) producer_id[n->output(k)] = inner.at(body->outputs()[k]);
      continue;
    }
    s += StrCat("  ", DotId(n->name()), " [label=", DotId(n->op() + "\\n" + n->name()), "];\n");
    for (const Value* in : n->inputs())
      if (in && producer_id.count(in)) s += StrCat("  ", DotId(producer_id.at(in)), " -> ", DotId(n->name()), ";\n");
    for (const Value* o : n->outputs()) producer_id[o] = n->name();
  }
  for (const FusionRefusal& x : r.refusals)
    if (x.code != refusal::kNotElementwise)
      s += StrCat("  // refused ", x.code, ": ", x.producer, " -> ", x.consumer, "\n");
  return s + "}\n";
}

Result<bool> ParseFusionFlag(const std::string& flag, Args& args, FusionOptions* o) {
  if (flag == "--no-fuse") {
    o->enabled = false;
  } else if (flag == "--max-group-size") {
    GF_ASSIGN_OR_RETURN(int64_t n, args.Int(flag, 1, 24));
    o->max_group_size = static_cast<int>(n);
  } else if (flag == "--exclude") {
    GF_ASSIGN_OR_RETURN(std::string name, args.Value(flag));
    o->exclude.insert(name);
  } else {
    return false;
  }
  return true;
}

}  // namespace graphfuse::cli
