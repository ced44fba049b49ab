// FuseSiblingNorms: LayerNormalizations of one input run as one kernel that reads the input
// once and computes each row's statistics once (FusedLayerNorms, src/cpu/kernels/norm.cc).
//
//   %a = LayerNormalization(%x, %g1, %b1)           %a, %m = FusedLayerNorms(%x, %g1, %b1, %g2, %b2)
//   %m = LayerNormalization(%x, %g2, %b2)   ==>              {norms = 2, with_bias = 1}
//
// Parallel blocks (GPT-NeoX, Falcon's two-norm layers) normalize the residual stream twice, once
// for the attention and once for the MLP; a block with one norm per input is left alone.
// Conditions: the norms read the same X over the same axis with the same epsilon; each one's
// Mean / InvStdDev outputs are unread; their scales and biases are constants or graph inputs
// (nothing computed, which could depend on a sibling's output), and either all have a bias or
// none does. A norm that fails one is refused against the first sibling, naming
// the difference. The pass runs after FuseRowwise: a norm that took an elementwise prologue
// there is a FusedNorm and stays one. The fused node is named fused_norms_<k>; its reference
// graph holds the original norms.
#include <map>
#include <string>
#include <vector>

#include "core/hash.h"
#include "passes/fusion_passes.h"
#include "passes/match.h"
#include "passes/pass_manager.h"
#include "passes/reference_graph.h"

namespace graphfuse {
namespace {

// Refusal codes of this pass (stable: part of the --json contract), beside refusal:: ones.
constexpr const char* kSiblingsDiffer = "sibling-norms-differ";           // axis, epsilon or bias differ
constexpr const char* kStatisticsUsed = "sibling-norm-statistics-used";   // Mean / InvStdDev are read
constexpr const char* kParamsComputed = "sibling-norm-params-computed";   // a scale or bias has a producer

class SiblingNorms {
 public:
  SiblingNorms(Graph& g, const FusionOptions& options, FusionReport* report)
      : g_(g), options_(options), report_(report) {}

  Result<int> Run() {
    if (!options_.enabled) return 0;
    // The plain LayerNorms of each input, in graph order.
    std::map<const Value*, std::vector<Node*>> readers;
    std::vector<const Value*> order;
    for (const auto& n : g_.nodes()) {
      if (!n->is(op::LayerNormalization) || n->input(0) == nullptr) continue;
      std::vector<Node*>& r = readers[n->input(0)];
      if (r.empty()) order.push_back(n->input(0));
      r.push_back(n.get());
    }
    int fused = 0;
    for (const Value* x : order) {
      const std::vector<Node*>& norms = readers[x];
      if (norms.size() < 2) continue;
      std::vector<Node*> group;
      for (Node* n : norms) {
        if (!Eligible(*n, group.empty() ? nullptr : group.front())) continue;
        if (!group.empty() && !SameForm(*group.front(), *n)) continue;
        group.push_back(n);
      }
      if (group.size() < 2) continue;
      GF_RETURN_IF_ERROR(Fuse(group));
      ++fused;
    }
    for (auto& [v, name] : renames_) GF_RETURN_IF_ERROR(g_.RenameValue(v, name));
    return fused;
  }

 private:
  // Whether `n` can join a group (`first`: the group's first norm, for the refusal's pair).
  bool Eligible(const Node& n, const Node* first) {
    const std::string against = first ? first->name() : n.input(0)->name();
    if (options_.exclude.count(n.name())) {
      Refuse(report_, n.name(), against, refusal::kExcluded, "the norm is excluded: it stays a kernel of its own");
      return false;
    }
    for (size_t o = 1; o < n.outputs().size(); ++o)
      if (!n.output(o)->uses().empty() || n.output(o)->is_graph_output()) {
        Refuse(report_, n.name(), against, kStatisticsUsed,
               StrCat("'", n.output(o)->name(), "' (the norm's ", o == 1 ? "Mean" : "InvStdDev",
                      ") is read: the fused norms write only Y"));
        return false;
      }
    for (size_t i = 1; i < n.inputs().size(); ++i)
      if (n.input(i) && n.input(i)->producer()) {
        Refuse(report_, n.name(), against, kParamsComputed,
               StrCat("the norm's ", i == 1 ? "scale" : "bias", " '", n.input(i)->name(),
                      "' is computed by a node (fused, it could depend on a sibling's output)"));
        return false;
      }
    return n.input(1) != nullptr;
  }

  // Whether `n` normalizes as `first` does: the same axis and epsilon, a bias or none alike.
  bool SameForm(const Node& first, const Node& n) {
    const size_t rank = n.input(0)->shape().size();
    auto axis = [rank](const Node& m) {
      const int64_t a = m.GetInt("axis", -1);
      return a < 0 ? a + static_cast<int64_t>(rank) : a;
    };
    std::string why;
    if (axis(first) != axis(n))
      why = StrCat("axis ", axis(n), " where '", first.name(), "' normalizes from axis ", axis(first));
    else if (first.GetFloat("epsilon", 1e-5f) != n.GetFloat("epsilon", 1e-5f))
      why = StrCat("epsilon ", n.GetFloat("epsilon", 1e-5f), " where '", first.name(), "' has ",
                   first.GetFloat("epsilon", 1e-5f));
    else if (HasBias(first) != HasBias(n))
      why = StrCat(HasBias(n) ? "a bias" : "no bias", " where '", first.name(), "' has ", HasBias(first) ? "one" : "none");
    if (why.empty()) return true;
    Refuse(report_, n.name(), first.name(), kSiblingsDiffer, StrCat("the two norms of one input differ: ", why));
    return false;
  }

  static bool HasBias(const Node& n) { return n.inputs().size() > 2 && n.input(2) != nullptr; }

  Status Fuse(const std::vector<Node*>& group) {
    Node& first = *group.front();
    Value* x = first.input(0);
    const bool with_bias = HasBias(first);
    std::vector<Value*> inputs = {x};
    std::vector<const Value*> outputs;
    std::vector<ValueType> types;
    std::vector<std::string> names;
    FusedGroupInfo info;
    for (Node* n : group) {
      inputs.push_back(n->input(1));
      if (with_bias) inputs.push_back(n->input(2));
      outputs.push_back(n->output(0));
      types.push_back({x->dtype(), x->shape()});
      names.push_back(n->output(0)->name() + "/fused");
      info.nodes.push_back(n->name());
    }
    info.name = StrCat("fused_norms_", next_++);
    info.kind = "norm";
    const float eps = first.GetFloat("epsilon", 1e-5f);
    info.kernel_name = StrCat("layernorm_x", group.size(), with_bias ? "" : "_nobias", "_", DTypeName(x->dtype()), "_",
                              Hash8(StrCat(x->TypeString(), eps, first.GetInt("axis", -1), group.size())));
    GF_ASSIGN_OR_RETURN(std::shared_ptr<Graph> ref, BuildReferenceGraph(info.name, inputs, group, outputs));
    AttributeMap attrs{{"norms", static_cast<int64_t>(group.size())},
                       {"with_bias", int64_t{with_bias}},
                       {"axis", first.GetInt("axis", -1)},
                       {"epsilon", eps},
                       {"kernel_name", info.kernel_name},
                       {"reference", std::shared_ptr<const Graph>(ref)}};
    Node* fused = g_.AddNodeTyped(op::FusedLayerNorms, inputs, std::move(attrs), types, info.name, names);
    for (size_t k = 0; k < group.size(); ++k) {
      g_.ReplaceAllUsesWith(group[k]->output(0), fused->output(k));
      renames_.push_back({fused->output(k), group[k]->output(0)->name()});
    }
    for (Node* n : group) g_.RemoveNode(n);
    if (report_) report_->groups.push_back(std::move(info));
    return Status::Ok();
  }

  Graph& g_;
  const FusionOptions& options_;
  FusionReport* report_;
  int next_ = 0;
  std::vector<std::pair<Value*, std::string>> renames_;
};

}  // namespace

Result<int> FuseSiblingNorms(Graph& g, const FusionOptions& options, FusionReport* report) {
  return SiblingNorms(g, options, report).Run();
}

}  // namespace graphfuse
