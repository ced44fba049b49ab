// FuseAttentionCache: a FusedAttention over a KV cache takes the cache's append in.
//
//   %kn = Rope(Transpose(Reshape(%k, [B,N,KV,d]), perm [0,2,1,3]), %cos, %sin)   (each step optional)
//   %vn = Transpose(Reshape(%v, [B,N,KV,dv]), perm [0,2,1,3])                     (each step optional)
//   %present_k = Concat(%past_k, %kn, axis 2)          ==>  %o, %present_k, %present_v =
//   %present_v = Concat(%past_v, %vn, axis 2)                FusedCachedAttention(%q, %k, %v, %past_k,
//   %o = FusedAttention(%q, %present_k, %present_v, ...)     %past_v, ...) {reference = graph {...}}
//
// The attention (k and v read as bhsd rows, no K RoPE inside, not projected) keeps its
// attributes; the node adds past_seq, the new rows' layouts and rope_new_k (attention_cache.h).
// The Concats' results may be read anywhere (they are graph outputs in exported decoders): they
// are the node's outputs 1 and 2. The new rows' Rope / Transpose / Reshape are absorbed only
// while each value is read by the chain alone, as FuseAttention absorbs Q's; where the walk
// stops, the value reached is read in place in its layout. A Rope is absorbed when it ropes
// with the attention's own cos / sin (the attention ropes Q with them), so the node needs no
// input of its own for it.
//
// Nothing the new node reads depends on the Concats or the attention (checked), so the rewrite
// creates no cycle.
#include <algorithm>
#include <map>
#include <set>

#include "ir/schemas/attention_cache.h"
#include "passes/fusion_passes.h"
#include "passes/pass_manager.h"
#include "passes/match.h"
#include "passes/reference_graph.h"

namespace graphfuse {
namespace {

// Stable refusal codes of this pass (the --json contract: never renamed, only added to).
constexpr const char* kCacheCycle = "attention-cache-cycle";    // an input depends on the present rows
constexpr const char* kCacheLayout = "attention-cache-layout";  // operands the node does not read

using match::SingleUseProducer;

// The new rows as the node reads them: the value, its layout and the nodes absorbed.
struct NewRows {
  Value* input = nullptr;
  std::string layout = "bhsd";
  bool rope = false;
  std::vector<Node*> nodes;  // in graph order once sorted
};

// A Rope the node applies to the new K rows: (x, cos, sin) with the attention's cos and sin,
// and no attribute it would not honour.
bool RopeIsAttentions(const Node& r, const Node& attention) {
  if (r.inputs().size() != 3) return false;
  for (const auto& [key, value] : r.attrs())
    if (key != "canonicalized_from") return false;
  const size_t n = attention.inputs().size();
  return attention.GetInt("rope_q", 0) != 0 && r.input(1) == attention.input(n - 2) &&
         r.input(2) == attention.input(n - 1);
}

// x ([B,KV,N,cols], the Concat's second input) read back through Rope (K only), the head split
// Transpose and its Reshape, each while read by the chain alone.
// A node named in `exclude` stops the walk.
NewRows MatchNewRows(Value* x, const Node* rope_of, const std::set<std::string>& exclude) {
  auto take = [&](Value* v, op::Id op) {
    Node* n = SingleUseProducer(v, op);
    return n && !exclude.count(n->name()) ? n : nullptr;
  };
  NewRows rows;
  rows.input = x;
  if (Node* r = rope_of ? take(x, op::Rope) : nullptr; r && RopeIsAttentions(*r, *rope_of)) {
    rows.rope = true;
    rows.nodes.push_back(r);
    rows.input = r->input(0);
  }
  if (Node* t = take(rows.input, op::Transpose); t && t->GetInts("perm") == std::vector<int64_t>{0, 2, 1, 3}) {
    rows.nodes.push_back(t);
    rows.input = t->input(0);
    rows.layout = "bshd";
    if (Node* rs = take(rows.input, op::Reshape)) {
      rows.nodes.push_back(rs);
      rows.input = rs->input(0);
    }
  }
  return rows;
}

// The Concat(past, new, axis 2) of [B,KV,*,cols] heads that gives `present`, or nullptr.
Node* AppendOf(const Value* present, const Shape& want) {
  Node* c = match::ProducerOf(present, op::Concat);
  if (!c || c->inputs().size() != 2 || present->shape() != want) return nullptr;
  const int64_t axis = c->GetInt("axis", 0);
  if (axis != 2 && axis != -2) return nullptr;
  return c->input(0)->dtype() == present->dtype() && c->input(1)->dtype() == present->dtype() ? c : nullptr;
}

// The node's operands as FusedCachedAttention's inference checks them.
Status CheckOperands(const AttributeMap& attrs, const std::vector<Value*>& inputs, const std::string& where) {
  GF_ASSIGN_OR_RETURN(schemas::CacheDims c, schemas::ReadCacheDims(attrs, where));
  std::vector<DType> dtypes;
  std::vector<Shape> shapes;
  for (const Value* v : inputs) dtypes.push_back(v->dtype()), shapes.push_back(v->shape());
  return schemas::CheckCacheOperands(c, dtypes, shapes, where, schemas::AttentionDTypes::kAnyFloat);
}

class CacheFuser {
 public:
  CacheFuser(Graph& g, const FusionOptions& o, FusionReport* report) : g_(g), o_(o), report_(report) {}

  Result<int> Run() {
    std::vector<Node*> attentions;
    for (const auto& n : g_.nodes())
      if (n->is(op::FusedAttention)) attentions.push_back(n.get());
    int formed = 0;
    for (Node* a : attentions) {
      GF_ASSIGN_OR_RETURN(bool done, TryFuse(a));
      formed += done ? 1 : 0;
    }
    if (formed == 0) return 0;
    GF_RETURN_IF_ERROR(g_.TopologicalSort());
    g_.RemoveDeadNodes();
    for (auto& [v, name] : renames_) GF_RETURN_IF_ERROR(g_.RenameValue(v, name));
    return formed;
  }

 private:
  Result<bool> TryFuse(Node* a) {
    auto dims = schemas::ReadDims(a->attrs(), a->Describe());
    if (!dims.ok() || dims->proj || dims->rope_k || dims->k != schemas::Layout::kBHSD ||
        dims->v != schemas::Layout::kBHSD || a->inputs().size() < 3)
      return false;
    Node* ck = AppendOf(a->input(1), Shape{dims->b, dims->kv_h, dims->sk, dims->d});
    Node* cv = AppendOf(a->input(2), Shape{dims->b, dims->kv_h, dims->sk, dims->dv});
    if (!ck || !cv || ck == cv || ck->input(0)->shape()[2] != cv->input(0)->shape()[2]) return false;
    const int64_t past = ck->input(0)->shape()[2];
    for (const Node* n : {static_cast<const Node*>(a), static_cast<const Node*>(ck), static_cast<const Node*>(cv)})
      if (o_.exclude.count(n->name())) {
        Refuse(report_, n, a, refusal::kExcluded, StrCat("node '", n->name(), "' is excluded: the KV cache's append stays apart"));
        return false;
      }
    const NewRows kn = MatchNewRows(ck->input(1), a, o_.exclude);
    const NewRows vn = MatchNewRows(cv->input(1), nullptr, o_.exclude);

    std::vector<Value*> inputs = {a->input(0), kn.input, vn.input, ck->input(0), cv->input(0)};
    for (size_t i = 3; i < a->inputs().size(); ++i) inputs.push_back(a->input(i));
    // No input may depend on the present rows or the attention (the node would feed itself).
    const std::set<const Node*> downstream = match::ReachableFrom({a, ck, cv});
    for (const Value* in : inputs)
      if (in->producer() && (downstream.count(in->producer()) || in->producer() == ck || in->producer() == cv)) {
        Refuse(report_, in->producer(), a, kCacheCycle,
               StrCat("'", in->name(), "' depends on the present K / V rows: the append stays a Concat"));
        return false;
      }

    AttributeMap attrs = a->attrs();
    attrs["past_seq"] = past;
    attrs["new_k_layout"] = kn.layout;
    attrs["new_v_layout"] = vn.layout;
    attrs["rope_new_k"] = int64_t{kn.rope};
    if (Status st = CheckOperands(attrs, inputs, a->Describe()); !st.ok()) {
      Refuse(report_, ck, a, kCacheLayout, StrCat("the KV cache's append stays apart: ", st.message()));
      return false;
    }

    // The absorbed nodes in graph order: the new rows' chains, the Concats, the attention.
    std::vector<Node*> members;
    for (auto it = kn.nodes.rbegin(); it != kn.nodes.rend(); ++it) members.push_back(*it);
    for (auto it = vn.nodes.rbegin(); it != vn.nodes.rend(); ++it) members.push_back(*it);
    members.insert(members.end(), {ck, cv, a});
    // The reference: the absorbed nodes, reading the node's inputs one to one, giving the
    // attention's output and the present rows.
    GF_ASSIGN_OR_RETURN(std::shared_ptr<const Graph> ref,
                        BuildReferenceGraph(a->name(), inputs, members, {a->output(), ck->output(), cv->output()}));

    attrs["kernel_name"] = StrCat("kvcache_", a->GetString("kernel_name", "attention"));
    attrs["reference"] = ref;
    const std::string name = a->name();
    auto fused = g_.AddNode("FusedCachedAttention", inputs, std::move(attrs), name, -1,
                            {g_.FreshName(a->output()->name()), g_.FreshName(ck->output()->name()),
                             g_.FreshName(cv->output()->name())});
    if (!fused.ok()) return fused.status().WithContext(StrCat("forming the KV cache attention of ", a->Describe()));
    const Value* olds[3] = {a->output(), ck->output(), cv->output()};
    for (int o = 0; o < 3; ++o) {
      if ((*fused)->output(o)->shape() != olds[o]->shape())
        return Internal(name, ": gives ", (*fused)->output(o)->TypeString(), " in place of '", olds[o]->name(), "' ",
                        olds[o]->TypeString());
      renames_.push_back({(*fused)->output(o), olds[o]->name()});
      g_.ReplaceAllUsesWith(const_cast<Value*>(olds[o]), (*fused)->output(o));
    }
    if (report_) {
      for (FusedGroupInfo& gi : report_->groups)
        if (gi.name == name) {  // FuseAttention's group: the append's nodes join it
          std::vector<std::string> added;
          for (Node* n : members)
            if (n != a) added.push_back(n->name());
          gi.nodes.insert(gi.nodes.begin(), added.begin(), added.end());
          gi.kernel_name = (*fused)->GetString("kernel_name", gi.kernel_name);
        }
    }
    g_.RemoveNode(a);
    return true;
  }

  Graph& g_;
  const FusionOptions& o_;
  FusionReport* report_;
  std::vector<std::pair<Value*, std::string>> renames_;
};

}  // namespace

Result<int> FuseAttentionCache(Graph& g, const FusionOptions& options, FusionReport* report) {
  if (!options.enabled) return 0;
  return CacheFuser(g, options, report).Run();
}

}  // namespace graphfuse
