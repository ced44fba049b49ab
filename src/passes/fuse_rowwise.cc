// Row-op fusion: the elementwise work around RMSNorm / LayerNormalization / Softmax runs inside
// the row kernel (src/cpu/kernels/fused_rowwise.cc), so the tensor it feeds the row op never
// makes a separate round trip through memory.
//
//   %h = FusedElementwise(%x, %r) {x + r}           %y, %h = FusedNorm(%x, %r, %w) {
//   %y = RMSNorm(%h, %w)                 ==>           body = {x + r}, norm = "RMSNorm" }
//   ... Add(%h, %o) ...                              ... Add(%h, %o) ...
//
//   %s = Add(Mul(%qk, %c), %mask)                   %p = FusedSoftmax(%qk, %c, %mask, %keep) {
//   %a = Softmax(%s)                     ==>           prologue = {qk * c + mask},
//   %p = Mul(%a, %keep)                                epilogue = {a * keep} }
//
// Note on the algorithm. One walk over the row ops in graph order. For each, the candidate
// prologue P is the producer of its input (a FusedElementwise group, or one op-table node) and,
// for Softmax, the candidate epilogue E is the only reader of its output. Each side is checked
// on its own (legality first, every refusal recorded with a stable code) and the row op absorbs
// the sides that pass. A merge of P, the row op R and E is acyclic when R reads P's output
// directly and E reads R's output directly, and no other input of R or E (scale, bias, the
// dropout mask) is reachable from P or R: otherwise the fused node would have to run both
// before and after the node on that path.
//
//      P ---------> R          R's scale computed from P's output through C: fusing P and R
//       \          ^           would need C both after and before the fused node: refused
//        --> C ----/           (would-create-cycle)
//
// Values P computes that a node outside the new group reads (the residual stream `x + r` read
// by the next residual add, a graph output) become extra outputs of the fused node. Each new
// node carries a "reference" graph (the original ops, inputs and outputs matching the node's
// one to one) for `graphfuse run --check-fusion`.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "core/hash.h"
#include "ir/text.h"
#include "passes/fusion_passes.h"
#include "passes/pass_manager.h"
#include "passes/match.h"

namespace graphfuse {
namespace {

// Refusal codes of this pass (stable: part of the --json contract), beside refusal:: ones.
constexpr const char* kAxisNotLast = "rowwise-axis-not-last";            // the row op reduces another axis
constexpr const char* kBroadcastExpansion = "rowwise-broadcast-expansion";  // the group's space != the row op's shape
constexpr const char* kDtypeUnsupported = "rowwise-dtype-unsupported";  // a dtype the fused row kernel does not take
constexpr const char* kStatisticsUsed = "rowwise-norm-statistics-used";  // LayerNorm's Mean / InvStdDev are read
constexpr const char* kOutputShared = "rowwise-softmax-output-shared";   // the probabilities have other readers

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// `name`, or name_1, name_2, ... if a value of that name exists in g.
std::string FreeName(const Graph& g, const std::string& name) {
  if (!g.FindValue(name)) return name;
  for (int k = 1;; ++k)
    if (std::string n = StrCat(name, "_", k); !g.FindValue(n)) return n;
}

// An elementwise node the row kernel can absorb, seen through its body: a FusedElementwise
// group, or one op-table node wrapped in a one-node body.
struct Side {
  Node* node = nullptr;
  std::shared_ptr<const Graph> body;
  std::vector<Value*> ins;   // the outer value each body input stands for
  std::vector<Value*> outs;  // the outer value each body output stands for
  std::vector<std::string> members, recomputed;
  Shape space;
  int group = -1;  // its entry in report->groups, or -1

  int OutputIndex(const Value* v) const {
    auto it = std::find(outs.begin(), outs.end(), v);
    return it == outs.end() ? -1 : static_cast<int>(it - outs.begin());
  }
  int InputIndex(const Value* v) const {
    auto it = std::find(ins.begin(), ins.end(), v);
    return it == ins.end() ? -1 : static_cast<int>(it - ins.begin());
  }
};

// Copies body's nodes into dst; `map` holds where body values went (inputs on entry).
Status CloneNodes(const Graph& body, Graph& dst, std::map<const Value*, Value*>& map) {
  for (const auto& n : body.nodes()) {
    std::vector<Value*> ins;
    for (Value* in : n->inputs()) ins.push_back(in ? map.at(in) : nullptr);
    std::vector<std::string> names;
    for (const Value* o : n->outputs()) names.push_back(FreeName(dst, o->name()));
    auto c = dst.AddNode(n->op(), ins, n->attrs(), n->name(), static_cast<int>(n->outputs().size()), names);
    if (!c.ok()) return c.status().WithContext(StrCat("copying ", n->Describe(), " into '", dst.name(), "'"));
    for (size_t k = 0; k < n->outputs().size(); ++k) map[n->output(k)] = (*c)->output(k);
  }
  return Status::Ok();
}

// "add_mul" from a body's ops (at most 6, then "_and<N>").
std::string OpsOf(const Graph& body) {
  std::string s;
  size_t k = 0;
  for (const auto& n : body.nodes()) {
    if (k < 6) s += (k ? "_" : "") + Lower(n->op());
    ++k;
  }
  if (k > 6) s += StrCat("_and", k - 6);
  return s;
}

class RowwiseFuser {
 public:
  RowwiseFuser(Graph& g, const FusionOptions& o, FusionReport* report) : g_(g), o_(o), report_(report) {}

  Result<int> Run() {
    std::vector<Node*> row_ops;
    for (const auto& n : g_.nodes())
      if (n->is(op::RMSNorm) || n->is(op::LayerNormalization) || n->is(op::Softmax)) row_ops.push_back(n.get());
    int formed = 0;
    for (Node* r : row_ops) {
      GF_ASSIGN_OR_RETURN(bool fused, r->is(op::Softmax) ? FuseSoftmax(r) : FuseNorm(r));
      formed += fused ? 1 : 0;
    }
    if (formed) GF_RETURN_IF_ERROR(g_.TopologicalSort());
    return formed;
  }

 private:
  bool Excluded(const std::string& name) const { return o_.exclude.count(name) != 0; }

  // The absorbable view of `n`, or nothing when it is not elementwise.
  std::optional<Side> AsSide(Node* n) const {
    Side s;
    s.node = n;
    if (n->is(op::FusedElementwise)) {
      auto it = n->attrs().find("body");
      const auto* b = it == n->attrs().end() ? nullptr : std::get_if<std::shared_ptr<const Graph>>(&it->second);
      if (!b || !*b || (*b)->outputs().empty() || (*b)->inputs().size() != n->inputs().size() ||
          (*b)->outputs().size() != n->outputs().size())
        return std::nullopt;
      s.body = *b;
      s.ins = n->inputs();
      s.outs = n->outputs();
      s.space = s.body->outputs()[0]->shape();
      for (size_t k = 0; report_ && k < report_->groups.size(); ++k)
        if (report_->groups[k].name == n->name()) {
          s.group = static_cast<int>(k);
          s.members = report_->groups[k].nodes;
          s.recomputed = report_->groups[k].recomputed;
        }
      if (s.group < 0)
        for (const auto& bn : s.body->nodes()) s.members.push_back(bn->name());
      return s;
    }
    if (!match::IsElementwiseOp(*n) || n->outputs().size() != 1) return std::nullopt;
    auto body = std::make_shared<Graph>(n->name());
    std::map<const Value*, Value*> map;
    for (Value* in : n->inputs()) {
      if (!in) return std::nullopt;
      if (map.count(in)) continue;
      auto bi = body->AddInput(FreeName(*body, in->name()), in->dtype(), in->shape());
      if (!bi.ok()) return std::nullopt;
      map[in] = *bi;
      s.ins.push_back(in);
    }
    std::vector<Value*> ins;
    for (Value* in : n->inputs()) ins.push_back(map.at(in));
    auto bn = body->AddNode(n->op(), ins, n->attrs(), n->name(), 1, {FreeName(*body, n->output()->name())});
    if (!bn.ok() || !body->MarkOutput((*bn)->output()).ok()) return std::nullopt;
    s.body = body;
    s.outs = {n->output()};
    s.space = n->output()->shape();
    s.members = {n->name()};
    return s;
  }

  // Whether a node producing one of `targets` is in `from` or reachable from it along uses.
  static bool Reaches(const std::vector<const Node*>& from, const std::vector<const Value*>& targets) {
    const std::set<const Node*> reached = match::ReachableFrom(from);
    for (const Value* t : targets) {
      const Node* p = t ? t->producer() : nullptr;
      if (p && (reached.count(p) || std::count(from.begin(), from.end(), p))) return true;
    }
    return false;
  }

  // The legality checks shared by prologues and epilogues; refuses and returns false on failure.
  bool SideAllowed(const Side& s, const Node* row, const Shape& rows_shape, bool prologue) {
    const Node* producer = prologue ? s.node : row;
    const Node* consumer = prologue ? row : s.node;
    std::vector<std::string> names = s.members;
    names.push_back(s.node->name());
    for (const std::string& n : names)
      if (Excluded(n)) {
        Refuse(report_, producer, consumer, refusal::kExcluded, StrCat("node '", n, "' is excluded by option"));
        return false;
      }
    if (s.space != rows_shape) {
      Refuse(report_, producer, consumer, kBroadcastExpansion,
             StrCat(s.node->Describe(), " iterates over ", ShapeToString(s.space), ", ", row->Describe(), " over ",
                    ShapeToString(rows_shape), ": the ", prologue ? "prologue" : "epilogue",
                    " would not map one to one onto the rows"));
      return false;
    }
    return true;
  }

  // Removes group `k` of the report (an absorbed FusedElementwise) and shifts later indices.
  void DropGroup(int k) {
    if (!report_ || k < 0) return;
    report_->groups.erase(report_->groups.begin() + k);
  }

  // Records the new group; refusals between two of its members no longer hold.
  void AddGroup(FusedGroupInfo info) {
    if (!report_) return;
    std::set<std::string> in(info.nodes.begin(), info.nodes.end());
    auto& rs = report_->refusals;
    rs.erase(std::remove_if(rs.begin(), rs.end(),
                            [&](const FusionRefusal& r) { return in.count(r.producer) && in.count(r.consumer); }),
             rs.end());
    report_->groups.push_back(std::move(info));
  }

  // Replaces `olds` (in order: consumers first) by `fused`, whose output k takes over `take[k]`
  // and its name.
  Status Replace(Node* fused, const std::vector<Value*>& take, const std::vector<Node*>& olds) {
    std::vector<std::string> names;
    for (size_t k = 0; k < take.size(); ++k) {
      names.push_back(take[k]->name());
      g_.ReplaceAllUsesWith(take[k], fused->output(k));
    }
    for (Node* n : olds) {
      for (const Value* o : n->outputs())
        if (!o->uses().empty() || o->is_graph_output())
          return Internal("fusing into '", fused->name(), "': ", n->Describe(), " output '", o->name(),
                          "' is still read");
      g_.RemoveNode(n);
    }
    for (size_t k = 0; k < take.size(); ++k) GF_RETURN_IF_ERROR(g_.RenameValue(fused->output(k), names[k]));
    return Status::Ok();
  }

  // ---- normalization prologue ----

  Result<bool> FuseNorm(Node* r) {
    Value* x = r->input(0);
    if (!x || !x->producer()) return false;
    std::optional<Side> p = AsSide(x->producer());
    if (!p) return false;  // a GEMM, attention or another row op: nothing to absorb
    const std::string where = StrCat(p->node->Describe(), " -> ", r->Describe(), " reading ", x->TypeString());
    if (!RowKernelTakes(x->dtype(), o_) || r->output()->dtype() != x->dtype()) {
      Refuse(report_, p->node, r, kDtypeUnsupported,
             StrCat(where, ": the fused norm kernel runs f32", o_.narrow_row_kernels ? ", f16 or bf16" : " only"));
      return false;
    }
    const int64_t rank = static_cast<int64_t>(x->shape().size());
    const int64_t axis = r->GetInt("axis", -1);
    if (!match::IsLastAxis(axis, x->shape().size())) {
      Refuse(report_, p->node, r, kAxisNotLast,
             StrCat(where, ": normalizes from axis ", axis, ", the fused kernel only over the last axis (", rank - 1,
                    " or -1)"));
      return false;
    }
    for (size_t k = 1; k < r->outputs().size(); ++k)
      if (r->output(k)->is_graph_output() || !r->output(k)->uses().empty()) {
        Refuse(report_, p->node, r, kStatisticsUsed,
               StrCat(where, ": its output '", r->output(k)->name(), "' (", k == 1 ? "Mean" : "InvStdDev",
                      ") is read, the fused kernel writes only Y"));
        return false;
      }
    if (!SideAllowed(*p, r, x->shape(), true)) return false;
    std::vector<Value*> params(r->inputs().begin() + 1, r->inputs().end());
    while (!params.empty() && params.back() == nullptr) params.pop_back();
    for (const Value* v : params)
      if (!v) {
        Refuse(report_, p->node, r, refusal::kNotElementwise, StrCat(where, ": an omitted parameter before a given one"));
        return false;
      }
    if (Reaches({p->node}, std::vector<const Value*>(params.begin(), params.end()))) {
      Refuse(report_, p->node, r, refusal::kWouldCreateCycle,
             StrCat(where, ": a scale or bias of ", r->Describe(), " is computed from ", p->node->Describe(),
                    "'s results"));
      return false;
    }
    const int k = norm_count_++;
    const std::string name = StrCat("fused_norm_", k);
    if (Excluded(name)) {
      Refuse(report_, p->node, r, refusal::kExcluded, StrCat("group ", name, " (", where, ") is excluded by option"));
      return false;
    }

    // Body outputs: those still read outside first (node outputs 1..), then the norm input
    // when only the norm reads it (the kernel keeps it in Y's buffer).
    const int xi = p->OutputIndex(x);
    GF_CHECK(xi >= 0, "norm input is not an output of its producer");
    std::vector<int> kept;
    for (size_t i = 0; i < p->outs.size(); ++i)
      if (match::IsUsedOutside(p->outs[i], r)) kept.push_back(static_cast<int>(i));
    const bool x_kept = std::count(kept.begin(), kept.end(), xi) != 0;
    std::vector<int> order = kept;
    if (!x_kept) order.push_back(xi);
    const int64_t norm_input = std::find(order.begin(), order.end(), xi) - order.begin();

    auto body = std::make_shared<Graph>(name);
    std::map<const Value*, Value*> bmap;
    for (size_t i = 0; i < p->ins.size(); ++i) {
      GF_ASSIGN_OR_RETURN(Value * bi, body->AddInput(FreeName(*body, p->ins[i]->name()), p->ins[i]->dtype(),
                                                     p->ins[i]->shape()));
      bmap[p->body->inputs()[i]] = bi;
    }
    GF_RETURN_IF_ERROR(CloneNodes(*p->body, *body, bmap));
    for (int i : order) GF_RETURN_IF_ERROR(body->MarkOutput(bmap.at(p->body->outputs()[static_cast<size_t>(i)])));

    // The node's inputs and outputs, and the reference graph of the original ops.
    std::vector<Value*> node_ins = p->ins;
    node_ins.insert(node_ins.end(), params.begin(), params.end());
    std::vector<Value*> take{r->output(0)};
    for (int i : kept) take.push_back(p->outs[static_cast<size_t>(i)]);
    GF_ASSIGN_OR_RETURN(auto reference, Reference(name, node_ins, take, {{p->body.get(), p->ins, p->outs}}, r));

    const float eps = r->GetFloat("epsilon", r->is(op::RMSNorm) ? 1e-6f : 1e-5f);
    const std::string hash = Hash8(StrCat(PrintGraph(*body), r->op(), eps, params.size()));
    FusedGroupInfo info;
    info.name = name;
    info.kind = "norm";
    info.kernel_name = StrCat(r->is(op::RMSNorm) ? "rmsnorm" : "layernorm", "_prologue_", OpsOf(*body), "_",
                              DTypeName(x->dtype()), "_", hash);
    info.nodes = p->members;
    info.nodes.push_back(r->name());
    info.recomputed = p->recomputed;

    AttributeMap attrs{{"body", std::shared_ptr<const Graph>(body)},
                       {"norm", r->op()},
                       {"epsilon", eps},
                       {"norm_input", norm_input},
                       {"prologue_outputs", static_cast<int64_t>(kept.size())},
                       {"kernel_name", info.kernel_name},
                       {"reference", std::shared_ptr<const Graph>(reference)}};
    std::vector<ValueType> types;
    for (const Value* v : take) types.push_back({v->dtype(), v->shape()});
    Node* fused = g_.AddNodeTyped("FusedNorm", node_ins, std::move(attrs), types, name);
    const int group = p->group;
    GF_RETURN_IF_ERROR(Replace(fused, take, {r, p->node}));
    DropGroup(group);
    AddGroup(std::move(info));
    return true;
  }

  // ---- softmax prologue / epilogue ----

  Result<bool> FuseSoftmax(Node* s) {
    Value* x = s->input(0);
    Value* y = s->output(0);
    std::optional<Side> p = x->producer() ? AsSide(x->producer()) : std::nullopt;
    // The epilogue: the only reader of the probabilities, when elementwise.
    std::optional<Side> e;
    const Node* shared_reader = nullptr;
    for (const Use& u : y->uses())
      if (AsSide(u.node)) shared_reader = u.node;
    if (const Use* u = match::SingleUse(y)) {
      e = AsSide(u->node);
      shared_reader = nullptr;
    }
    if (!p && !e && !shared_reader) return false;
    if (shared_reader) {
      Refuse(report_, s, shared_reader, kOutputShared,
             StrCat(s->Describe(), " output ", y->TypeString(), " is read by ", y->uses().size(), " nodes",
                    y->is_graph_output() ? " and is a graph output" : "", "; ", shared_reader->Describe(),
                    " cannot run as its epilogue"));
    }
    if (!p && !e) return false;
    const Node* other = p ? p->node : e->node;
    const std::string where = StrCat(s->Describe(), " over ", x->TypeString());
    if (!RowKernelTakes(x->dtype(), o_) || y->dtype() != x->dtype()) {
      Refuse(report_, p ? p->node : s, p ? s : e->node, kDtypeUnsupported,
             StrCat(where, ": the fused softmax kernel runs f32", o_.narrow_row_kernels ? ", f16 or bf16" : " only"));
      return false;
    }
    const int64_t rank = static_cast<int64_t>(x->shape().size());
    const int64_t axis = s->GetInt("axis", -1);
    if (!match::IsLastAxis(axis, x->shape().size())) {
      Refuse(report_, p ? p->node : s, p ? s : e->node, kAxisNotLast,
             StrCat(where, " and ", other->Describe(), ": softmax over axis ", axis,
                    ", the fused kernel only over the last axis (", rank - 1, " or -1)"));
      return false;
    }
    if (p && !SideAllowed(*p, s, x->shape(), true)) p.reset();
    if (e && !SideAllowed(*e, s, y->shape(), false)) e.reset();
    int ei = -1;  // the epilogue body input reading the probabilities
    if (e) {
      ei = e->InputIndex(y);
      std::vector<const Value*> others;
      for (size_t i = 0; i < e->ins.size(); ++i)
        if (static_cast<int>(i) != ei) others.push_back(e->ins[i]);
      std::vector<const Node*> from{s};
      if (p) from.push_back(p->node);
      if (ei < 0) {
        e.reset();
      } else if (!RowKernelTakes(e->outs[0]->dtype(), o_)) {
        Refuse(report_, s, e->node, kDtypeUnsupported,
               StrCat(e->node->Describe(), " writes ", e->outs[0]->TypeString(), " after ", where,
                      ": the fused softmax kernel keeps the probabilities in its first output, which must be a float "
                      "dtype its kernel takes"));
        e.reset();
      } else if (Reaches(from, others)) {
        Refuse(report_, s, e->node, refusal::kWouldCreateCycle,
               StrCat(e->node->Describe(), " after ", where, " reads a value computed from ",
                      p ? p->node->Describe() + " or " : "", s->Describe()));
        e.reset();
      }
    }
    if (!p && !e) return false;
    const int k = softmax_count_++;
    const std::string name = StrCat("fused_softmax_", k);
    if (Excluded(name)) {
      Refuse(report_, p ? p->node : s, p ? s : e->node, refusal::kExcluded, StrCat("group ", name, " is excluded by option"));
      return false;
    }

    std::vector<Value*> node_ins, take;
    std::shared_ptr<Graph> prologue, epilogue;
    int64_t softmax_input = 0;
    std::vector<int> kept;
    if (e) {
      take = e->outs;
    } else {
      take = {y};
    }
    if (p) {
      const int xi = p->OutputIndex(x);
      GF_CHECK(xi >= 0, "softmax input is not an output of its producer");
      for (size_t i = 0; i < p->outs.size(); ++i)
        if (match::IsUsedOutside(p->outs[i], s)) kept.push_back(static_cast<int>(i));
      std::vector<int> order = kept;
      if (!std::count(kept.begin(), kept.end(), xi)) order.push_back(xi);
      softmax_input = std::find(order.begin(), order.end(), xi) - order.begin();
      prologue = std::make_shared<Graph>(name + "_prologue");
      std::map<const Value*, Value*> bmap;
      for (size_t i = 0; i < p->ins.size(); ++i) {
        GF_ASSIGN_OR_RETURN(Value * bi, prologue->AddInput(FreeName(*prologue, p->ins[i]->name()),
                                                           p->ins[i]->dtype(), p->ins[i]->shape()));
        bmap[p->body->inputs()[i]] = bi;
      }
      GF_RETURN_IF_ERROR(CloneNodes(*p->body, *prologue, bmap));
      for (int i : order)
        GF_RETURN_IF_ERROR(prologue->MarkOutput(bmap.at(p->body->outputs()[static_cast<size_t>(i)])));
      node_ins = p->ins;
      for (int i : kept) take.push_back(p->outs[static_cast<size_t>(i)]);
    } else {
      node_ins = {x};
    }
    if (e) {
      for (size_t i = 0; i < e->ins.size(); ++i)
        if (static_cast<int>(i) != ei) node_ins.push_back(e->ins[i]);
      // The epilogue's body as it is: same inputs and outputs, in the same order.
      epilogue = std::make_shared<Graph>(name + "_epilogue");
      std::map<const Value*, Value*> bmap;
      for (size_t i = 0; i < e->ins.size(); ++i) {
        GF_ASSIGN_OR_RETURN(Value * bi, epilogue->AddInput(FreeName(*epilogue, e->ins[i]->name()),
                                                           e->ins[i]->dtype(), e->ins[i]->shape()));
        bmap[e->body->inputs()[i]] = bi;
      }
      GF_RETURN_IF_ERROR(CloneNodes(*e->body, *epilogue, bmap));
      for (const Value* o : e->body->outputs()) GF_RETURN_IF_ERROR(epilogue->MarkOutput(bmap.at(o)));
    }
    std::vector<BodyUse> bodies;
    if (p) bodies.push_back({p->body.get(), p->ins, p->outs});
    std::optional<BodyUse> after;
    if (e) after = BodyUse{e->body.get(), e->ins, e->outs};
    GF_ASSIGN_OR_RETURN(auto reference, Reference(name, node_ins, take, bodies, s, after));

    const std::string hash =
        Hash8(StrCat(prologue ? PrintGraph(*prologue) : "", "|", epilogue ? PrintGraph(*epilogue) : ""));
    FusedGroupInfo info;
    info.name = name;
    info.kind = "softmax";
    info.kernel_name = StrCat("softmax", prologue ? "_prologue_" + OpsOf(*prologue) : "",
                              epilogue ? "_epilogue_" + OpsOf(*epilogue) : "", "_", DTypeName(x->dtype()), "_", hash);
    if (p) {
      info.nodes = p->members;
      info.recomputed = p->recomputed;
    }
    info.nodes.push_back(s->name());
    if (e) {
      info.nodes.insert(info.nodes.end(), e->members.begin(), e->members.end());
      info.recomputed.insert(info.recomputed.end(), e->recomputed.begin(), e->recomputed.end());
    }

    AttributeMap attrs{{"kernel_name", info.kernel_name}, {"reference", std::shared_ptr<const Graph>(reference)}};
    if (prologue) {
      attrs["prologue"] = std::shared_ptr<const Graph>(prologue);
      attrs["softmax_input"] = softmax_input;
      attrs["prologue_outputs"] = static_cast<int64_t>(kept.size());
    }
    if (epilogue) {
      attrs["epilogue"] = std::shared_ptr<const Graph>(epilogue);
      attrs["epilogue_input"] = static_cast<int64_t>(ei);
    }
    std::vector<ValueType> types;
    for (const Value* v : take) types.push_back({v->dtype(), v->shape()});
    Node* fused = g_.AddNodeTyped("FusedSoftmax", node_ins, std::move(attrs), types, name);
    std::vector<Node*> olds;
    if (e) olds.push_back(e->node);
    olds.push_back(s);
    if (p) olds.push_back(p->node);
    // Drop absorbed groups from the report, the later index first.
    std::vector<int> groups;
    if (p && p->group >= 0) groups.push_back(p->group);
    if (e && e->group >= 0) groups.push_back(e->group);
    std::sort(groups.rbegin(), groups.rend());
    GF_RETURN_IF_ERROR(Replace(fused, take, olds));
    for (int gi : groups) DropGroup(gi);
    AddGroup(std::move(info));
    return true;
  }

  // ---- the reference graph for --check-fusion ----

  struct BodyUse {
    const Graph* body;
    std::vector<Value*> ins, outs;  // outer values of its inputs / outputs
  };

  // A graph computing `take` from `node_ins` with the original ops: the bodies before the row
  // op, the row op itself, then `after` (the epilogue). Its inputs and outputs match the fused
  // node's one to one.
  Result<std::shared_ptr<Graph>> Reference(const std::string& name, const std::vector<Value*>& node_ins,
                                           const std::vector<Value*>& take, const std::vector<BodyUse>& before,
                                           const Node* row, std::optional<BodyUse> after = std::nullopt) {
    auto ref = std::make_shared<Graph>(name + "_reference");
    std::map<const Value*, Value*> outer;  // outer value -> reference value
    for (Value* v : node_ins) {
      GF_ASSIGN_OR_RETURN(Value * in, ref->AddInput(FreeName(*ref, v->name()), v->dtype(), v->shape()));
      if (!outer.count(v)) outer[v] = in;
    }
    auto add_body = [&](const BodyUse& b) -> Status {
      std::map<const Value*, Value*> bmap;
      for (size_t i = 0; i < b.ins.size(); ++i) bmap[b.body->inputs()[i]] = outer.at(b.ins[i]);
      GF_RETURN_IF_ERROR(CloneNodes(*b.body, *ref, bmap));
      for (size_t i = 0; i < b.outs.size(); ++i) outer[b.outs[i]] = bmap.at(b.body->outputs()[i]);
      return Status::Ok();
    };
    for (const BodyUse& b : before) GF_RETURN_IF_ERROR(add_body(b));
    std::vector<Value*> row_ins;
    for (Value* v : row->inputs()) row_ins.push_back(v ? outer.at(v) : nullptr);
    while (!row_ins.empty() && row_ins.back() == nullptr) row_ins.pop_back();
    auto rn = ref->AddNode(row->op(), row_ins, row->attrs(), row->name(), 1, {FreeName(*ref, row->output(0)->name())});
    if (!rn.ok()) return rn.status().WithContext(StrCat("building the reference of ", name));
    outer[row->output(0)] = (*rn)->output(0);
    if (after) GF_RETURN_IF_ERROR(add_body(*after));
    for (Value* v : take) GF_RETURN_IF_ERROR(ref->MarkOutput(outer.at(v)));
    if (ref->outputs().size() != take.size())
      return Internal("the reference of ", name, " has ", ref->outputs().size(), " outputs for ", take.size());
    return ref;
  }

  Graph& g_;
  const FusionOptions& o_;
  FusionReport* report_;
  int norm_count_ = 0, softmax_count_ = 0;
};

}  // namespace

Result<int> FuseRowwise(Graph& g, const FusionOptions& options, FusionReport* report) {
  if (!options.enabled) return 0;
  return RowwiseFuser(g, options, report).Run();
}

}  // namespace graphfuse
