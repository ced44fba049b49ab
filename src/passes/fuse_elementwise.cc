#include "core/hash.h"
#include "passes/fuse_elementwise.h"
#include "passes/pass_manager.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>

#include "ir/op_registry.h"
#include "ir/text.h"
#include "ops/reference.h"
#include "passes/match.h"

namespace graphfuse {

int64_t CountKernels(const Graph& g) {
  int64_t k = 0;
  for (const auto& n : g.nodes()) {
    const OpSchema* s = FindSchema(n->op());
    k += (s && !s->view) ? 1 : 0;
  }
  return k;
}

std::string KernelHash(const Graph& body) { return Hash8(PrintGraph(body)); }

namespace {

bool ComputesInInts(const Node& n) {
  auto kind = OpFromName(n.op());
  std::vector<DType> dtypes;
  for (const Value* in : n.inputs()) dtypes.push_back(in ? in->dtype() : DType::kF32);
  return kind.ok() && ComputesInIntegers(*kind, dtypes);
}

class Planner {
 public:
  Planner(Graph& g, const FusionOptions& o) : g_(g), o_(o) {
    for (const auto& n : g.nodes()) {
      index_[n.get()] = static_cast<int>(order_.size());
      order_.push_back(n.get());
    }
    const int n = static_cast<int>(order_.size());
    parent_.resize(n);
    std::iota(parent_.begin(), parent_.end(), 0);
    seen_.assign(n, 0);
    elementwise_.resize(n);
    for (int i = 0; i < n; ++i) {
      elementwise_[i] = match::IsElementwiseOp(*order_[i]);
      if (elementwise_[i]) members_[i] = {i};
    }
  }

  Result<FusionReport> Run() {
    FusionReport rep;
    rep.kernels_before = CountKernels(g_);
    Vertical();
    Horizontal();
    std::vector<std::vector<int>> groups = FinalGroups();
    // Refusals only matter where the two sides ended up apart.
    for (const Pending& p : pending_)
      if (Find(p.a) != Find(p.b) || !elementwise_[p.a] || !elementwise_[p.b])
        Refuse(&rep, p.refusal.producer, p.refusal.consumer, p.refusal.code.c_str(), p.refusal.message);
    std::vector<bool> excluded(groups.size());
    for (size_t k = 0; k < groups.size(); ++k) {
      excluded[k] = o_.exclude.count(StrCat("fused_", k)) != 0;
      if (excluded[k]) {
        Refuse(&rep, order_[groups[k].front()]->name(), order_[groups[k].back()]->name(), refusal::kExcluded,
               StrCat("group fused_", k, " is excluded by option"));
        continue;
      }
      for (int i : groups[k]) group_of_[order_[i]] = static_cast<int>(k);
    }
    clones_.assign(groups.size(), {});
    for (size_t k = 0; k < groups.size(); ++k)
      if (!excluded[k]) PlanRecompute(groups[k], static_cast<int>(k));
    for (size_t k = 0; k < groups.size(); ++k) {
      if (excluded[k]) continue;
      GF_ASSIGN_OR_RETURN(FusedGroupInfo info, Rewrite(groups[k], static_cast<int>(k)));
      rep.groups.push_back(std::move(info));
    }
    GF_RETURN_IF_ERROR(g_.TopologicalSort());
    g_.RemoveDeadNodes();
    for (auto& [v, name] : renames_) GF_RETURN_IF_ERROR(g_.RenameValue(v, name));
    rep.kernels_after = CountKernels(g_);
    return rep;
  }

 private:
  struct Pending {
    int a, b;
    FusionRefusal refusal;
  };

  int Find(int i) { return parent_[i] == i ? i : parent_[i] = Find(parent_[i]); }
  // Members of the group whose root is `root`, in node order (kept up to date by TryMerge).
  const std::vector<int>& Members(int root) const { return members_.at(root); }

  GroupSummary Summarize(const std::vector<int>& members) {
    GroupSummary s;
    std::set<const Node*> in_group;
    for (int i : members) in_group.insert(order_[i]);
    const Node* first = order_[members.front()];
    s.name = first->name();
    s.space = first->output()->shape();
    s.integer_domain = ComputesInInts(*first);
    for (int i : members) {
      const Node* n = order_[i];
      ++s.size;
      if (NeedsRoundingStep(*OpFromName(n->op()), n->output()->dtype(), s.integer_domain)) ++s.size;  // its rounding step
      for (const Value* in : n->inputs())
        if (in && !(in->producer() && in_group.count(in->producer()))) s.reads.insert(in);
      for (const Value* out : n->outputs())
        if (match::IsUsedOutside(out, in_group)) s.writes.insert(out);
    }
    return s;
  }

  // Nodes of the group whose root is `root`: its members, or the node alone (a node that is
  // not elementwise, or an elementwise one that has not joined a group yet).
  const std::vector<int>& GroupNodes(int root) {
    auto it = members_.find(root);
    if (it != members_.end()) return it->second;
    single_ = {root};
    return single_;
  }

  // Would merging the groups `from` and `to` create a cycle? It does exactly when a path leaves
  // one and enters the other through anything else: a node outside both, or another group
  // (the groups are fused nodes-to-be, so a path entering a group at one member may leave it
  // from any other, earlier in node order than where it entered). Searched over the graph of
  // groups, which the merges keep acyclic, in the direction from -> to; callers ask both
  // directions. One bound holds: a node after every member of every group so far (and of
  // `to`) is a group of its own whose readers all come after it, so no path through it
  // comes back to `to`. Merges along producer -> consumer edges in node order keep that bound
  // near the node being visited.
  bool PathThroughOtherGroups(const std::vector<int>& from, const std::vector<int>& to) {
    const int limit = std::max(last_grouped_, *std::max_element(to.begin(), to.end()));
    ++stamp_;
    const int from_root = Find(from.front()), to_root = Find(to.front());
    seen_[from_root] = seen_[to_root] = stamp_;
    std::vector<int>& stack = stack_;  // nodes whose readers are still to visit
    stack.clear();
    auto enter = [&](int j) {  // j reads a value of the path: stack its whole group
      if (j > limit) return;
      const int r = Find(j);
      if (seen_[r] == stamp_) return;
      seen_[r] = stamp_;
      for (int m : GroupNodes(r)) stack.push_back(m);
    };
    for (int i : from)
      for (const Value* o : order_[i]->outputs())
        for (const Use& u : o->uses()) enter(index_.at(u.node));
    while (!stack.empty()) {
      const int j = stack.back();
      stack.pop_back();
      for (const Value* o : order_[j]->outputs())
        for (const Use& u : o->uses()) {
          const int k = index_.at(u.node);
          if (Find(k) == to_root) return true;
          enter(k);
        }
    }
    return false;
  }

  // A refusal between nodes a and b, kept until the groups are final (RefuseLater: recorded only
  // where the two ended up apart).
  void RefuseLater(int a, int b, const char* code, const std::string& message) {
    const std::string pa = order_[a]->name(), pb = order_[b]->name();
    for (const Pending& p : pending_)
      if (p.refusal.producer == pa && p.refusal.consumer == pb && p.refusal.code == code) return;
    pending_.push_back({a, b, {pa, pb, code, message}});
  }

  // Tries to merge the groups of nodes a and b (a's group first); records why not.
  bool TryMerge(int a, int b, const std::string& relation) {
    const int ra = Find(a), rb = Find(b);
    if (ra == rb) return true;
    if (!o_.enabled) {
      RefuseLater(a, b, refusal::kDisabled, "fusion is switched off");
      return false;
    }
    for (int n : {a, b})
      if (o_.exclude.count(order_[n]->name())) {
        RefuseLater(a, b, refusal::kExcluded, StrCat("node '", order_[n]->name(), "' is excluded by option"));
        return false;
      }
    const std::vector<int> ma = Members(ra), mb = Members(rb);
    std::vector<int> mm = ma;
    mm.insert(mm.end(), mb.begin(), mb.end());
    std::sort(mm.begin(), mm.end());
    const GroupSummary A = Summarize(ma), B = Summarize(mb), M = Summarize(mm);
    FusionDecision d = CheckMerge(A, B, M, o_);
    if (d.allowed && (PathThroughOtherGroups(ma, mb) || PathThroughOtherGroups(mb, ma)))
      d = FusionDecision::Refuse(refusal::kWouldCreateCycle,
                                 StrCat("a path from '", order_[a]->name(), "' to '", order_[b]->name(),
                                        "' (or back) runs through a node or group outside both"));
    if (d.allowed) d = PolicyAllowsMerge(A, B, M, o_);
    if (!d.allowed) {
      RefuseLater(a, b, d.code, StrCat(relation, ": ", d.message));
      return false;
    }
    parent_[rb] = ra;
    last_grouped_ = std::max(last_grouped_, mm.back());
    members_[ra] = std::move(mm);
    members_.erase(rb);
    return true;
  }

  void Vertical() {
    for (int i = 0; i < static_cast<int>(order_.size()); ++i) {
      const Node* n = order_[i];
      for (const Value* in : n->inputs()) {
        if (!in || !in->producer()) continue;
        const int p = index_.at(in->producer());
        if (elementwise_[p] && elementwise_[i]) {
          TryMerge(p, i, StrCat("'", in->name(), "' flows from '", order_[p]->name(), "' to '", n->name(), "'"));
        } else if (elementwise_[p] != elementwise_[i]) {
          const Node* other = elementwise_[p] ? n : order_[p];
          const OpSchema* schema = FindSchema(other->op());
          RefuseLater(p, i, refusal::kNotElementwise,
                 StrCat(other->Describe(), schema && schema->view
                                               ? " is a view (no kernel of its own), which a group does not take in"
                                               : " is not an elementwise op (it runs as its own kernel)"));
        }
      }
    }
  }

  void Horizontal() {
    // Readers of each tensor, in order; tensors in the order of their first reader (not of
    // their addresses: the plan must not change from one run to the next).
    std::map<const Value*, std::vector<int>> readers;
    std::vector<const Value*> read;
    for (int i = 0; i < static_cast<int>(order_.size()); ++i)
      if (elementwise_[i])
        for (const Value* in : order_[i]->inputs())
          if (in) {
            std::vector<int>& rs = readers[in];
            if (rs.empty()) read.push_back(in);
            rs.push_back(i);
          }
    for (const Value* v : read) {
      const std::vector<int>& rs = readers.at(v);
      if (v->numel() <= 1) continue;  // a shared scalar is no reason to merge
      for (size_t x = 1; x < rs.size(); ++x)
        TryMerge(rs[0], rs[x], StrCat("'", order_[rs[0]]->name(), "' and '", order_[rs[x]]->name(),
                                      "' both read '", v->name(), "'"));
    }
  }

  std::vector<std::vector<int>> FinalGroups() {
    std::map<int, std::vector<int>> by_root;
    for (int i = 0; i < static_cast<int>(order_.size()); ++i)
      if (elementwise_[i]) by_root[Find(i)].push_back(i);
    std::vector<std::vector<int>> groups;
    for (auto& [root, m] : by_root)
      if (m.size() >= 2) groups.push_back(m);
    std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.front() < b.front(); });
    return groups;
  }

  // Whether `v`, computed in group `k` (or by a lone node when k < 0), must be written to
  // memory: a graph output, or read by a node that neither belongs to k nor recomputes v.
  bool NeededOutside(const Value* v, int k) {
    if (v->is_graph_output()) return true;
    for (const Use& u : v->uses()) {
      auto it = group_of_.find(u.node);
      const int ug = it == group_of_.end() ? -1 : it->second;
      if (ug == k && k >= 0) continue;
      if (ug >= 0 && std::count(clones_[ug].begin(), clones_[ug].end(), index_.at(v->producer()))) continue;
      return true;
    }
    return false;
  }

  // The recompute policy: a cheap producer outside group k whose value k reads is computed
  // again inside k when that moves fewer bytes (k reads the producer's inputs instead of its
  // value, and the value may no longer need writing at all).
  void PlanRecompute(const std::vector<int>& members, int k) {
    GroupSummary g = Summarize(members);
    // Candidates in node order (each decision changes the next one's byte count).
    std::vector<const Value*> candidates(g.reads.begin(), g.reads.end());
    auto position = [&](const Value* v) { return v->producer() ? index_.at(v->producer()) : -1; };
    std::sort(candidates.begin(), candidates.end(), [&](const Value* a, const Value* b) {
      return position(a) != position(b) ? position(a) < position(b) : a->name() < b->name();
    });
    for (const Value* v : candidates) {
      const Node* p = v->producer();
      if (!p) continue;
      const int pi = index_.at(p);
      if (!elementwise_[pi] || GetOpInfo(*OpFromName(p->op())).cost > o_.recompute_max_cost) continue;
      if (p->output()->shape() != g.space || ComputesInInts(*p) != g.integer_domain) continue;
      bool inputs_in_memory = true;  // the clone reads only tensors that exist anyway
      int64_t new_bytes = 0;
      std::set<const Value*> reads = g.reads;
      reads.erase(v);
      for (const Value* in : p->inputs()) {
        inputs_in_memory &= !in->producer() || !elementwise_[index_.at(in->producer())];
        if (reads.insert(in).second) new_bytes += in->numel() * static_cast<int64_t>(DTypeSize(in->dtype()));
      }
      if (!inputs_in_memory || g.size + 1 > o_.max_group_size || static_cast<int>(reads.size()) > o_.max_inputs) continue;
      const int64_t v_bytes = v->numel() * static_cast<int64_t>(DTypeSize(v->dtype()));
      auto it = group_of_.find(p);
      const int pg = it == group_of_.end() ? -1 : it->second;
      clones_[k].push_back(pi);  // tentatively, to ask whether v is still needed
      const bool write_saved = !NeededOutside(v, pg);
      if (new_bytes >= v_bytes + (write_saved ? v_bytes : 0)) {
        clones_[k].pop_back();
        continue;
      }
      g.reads = reads;
      ++g.size;
    }
  }

  Result<FusedGroupInfo> Rewrite(const std::vector<int>& group_members, int k) {
    const std::string name = StrCat("fused_", k);
    FusedGroupInfo info;
    info.name = name;
    std::set<const Node*> in_group;
    for (int i : group_members) in_group.insert(order_[i]);
    // Recomputed producers come first: they read only tensors in memory.
    std::vector<int> members = clones_[k];
    members.insert(members.end(), group_members.begin(), group_members.end());
    for (int i : clones_[k]) info.recomputed.push_back(order_[i]->name());
    auto body = std::make_shared<Graph>(name);
    std::map<const Value*, Value*> map;
    std::vector<Value*> ext_inputs, ext_outputs;
    for (int i : members) {
      const Node* n = order_[i];
      if (in_group.count(n)) info.nodes.push_back(n->name());
      std::vector<Value*> ins;
      for (Value* in : n->inputs()) {
        if (!map.count(in)) {
          GF_ASSIGN_OR_RETURN(Value * bi, body->AddInput(StrCat("in", ext_inputs.size()), in->dtype(), in->shape()));
          map[in] = bi;
          ext_inputs.push_back(in);
        }
        ins.push_back(map.at(in));
      }
      std::vector<std::string> out_names;
      for (const Value* o : n->outputs()) out_names.push_back(o->name());
      auto bn = body->AddNode(n->op(), ins, n->attrs(), n->name(), -1, out_names);
      if (!bn.ok()) return bn.status().WithContext(StrCat("building ", name));
      for (size_t k = 0; k < n->outputs().size(); ++k) map[n->output(k)] = (*bn)->output(k);
    }
    for (int i : group_members)
      for (Value* o : order_[i]->outputs()) {
        if (NeededOutside(o, k)) {
          GF_RETURN_IF_ERROR(body->MarkOutput(map.at(o)));
          ext_outputs.push_back(o);
        }
      }
    GF_CHECK(!ext_outputs.empty(), "fused group ", name, " writes nothing (dead nodes must be removed first)");
    // Kernel name: what it fuses, its dtype, and a hash of the body.
    std::string ops;
    for (size_t k = 0; k < members.size() && k < 6; ++k) {
      std::string op = order_[members[k]]->op();
      for (char& c : op) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      ops += (k ? "_" : "") + op;
    }
    if (members.size() > 6) ops += StrCat("_and", members.size() - 6);
    info.kernel_name = StrCat("fused_", ops, "_", DTypeName(ext_outputs.front()->dtype()), "_", KernelHash(*body));

    std::vector<ValueType> types;
    for (const Value* o : ext_outputs) types.push_back({o->dtype(), o->shape()});
    AttributeMap attrs{{"body", std::shared_ptr<const Graph>(body)}, {"kernel_name", info.kernel_name}};
    Node* fused = g_.AddNodeTyped("FusedElementwise", ext_inputs, std::move(attrs), types, name);
    for (size_t k = 0; k < ext_outputs.size(); ++k) {
      renames_.push_back({fused->output(k), ext_outputs[k]->name()});
      g_.ReplaceAllUsesWith(ext_outputs[k], fused->output(k));
    }
    return info;
  }

  Graph& g_;
  const FusionOptions& o_;
  std::vector<Node*> order_;
  std::map<const Node*, int> index_;
  std::vector<int> parent_;
  std::vector<bool> elementwise_;
  int last_grouped_ = -1;               // the last node in node order that belongs to a group of two or more
  std::vector<int> seen_;               // PathThroughOtherGroups: group roots visited, by stamp
  int stamp_ = 0;
  std::vector<int> stack_, single_;     // its scratch
  std::map<int, std::vector<int>> members_;  // group root -> its nodes, in order
  std::vector<Pending> pending_;
  std::vector<std::pair<Value*, std::string>> renames_;
  std::map<const Node*, int> group_of_;  // members of the fused groups being formed
  std::vector<std::vector<int>> clones_;  // per group: producers recomputed in it
};

}  // namespace

Result<FusionReport> FuseElementwise(Graph& g, const FusionOptions& options) {
  g.RemoveDeadNodes();  // a group must have something to write
  GF_RETURN_IF_ERROR(g.TopologicalSort());  // the planner's cycle check relies on node order
  return Planner(g, options).Run();
}

}  // namespace graphfuse
