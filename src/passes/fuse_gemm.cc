// FuseGemm: horizontal GEMM fusion and GEMM epilogues.
//
//   %q = MatMul(%x, %Wq)                   %q, %k, %v = FusedGemm(%x, %Wqkv) {splits = 3}
//   %k = MatMul(%x, %Wk)           ==>
//   %v = MatMul(%x, %Wv)
//
//   %g = MatMul(%h, %Wg)                   %y = FusedGemm(%h, %Wgu) {splits = 2, epilogue = graph {
//   %u = MatMul(%h, %Wu)           ==>         %s = Silu(%p0); %y = Mul(%s, %p1) }}
//   %y = FusedElementwise(%g, %u) {Silu, Mul}
//
// Note on the algorithm. A projection is a MatMul of an f32 activation A [..., K] by constant
// 2-D weights [K, N]. Projections of the same A with the same N form one GEMM over weights
// concatenated along N (the activation is read once; one launch). The epilogue is every
// elementwise node (a FusedElementwise group or a single op-table op) that reads a projection
// and iterates over exactly the projection's shape; their bodies are inlined into one graph
// that the same kernel applies after its GEMM blocks, over whole rows of its workspace, so a
// projection read only by the epilogue is never a tensor of the plan (fused_gemm.cc). A member whose other operands depend on a projection through
// a node outside the group would create a cycle and stays out (would-create-cycle), as does
// one that reads another member's result (it would need that member first; kept simple).
// Everything else that reads a projection gets it as an output of the fused node.
#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "core/prepared_store.h"
#include "ir/elementwise_body.h"
#include "ir/schemas/fused_gemm.h"
#include "passes/fusion_passes.h"
#include "passes/pass_manager.h"
#include "passes/gemm_epilogue_form.h"
#include "passes/match.h"

namespace graphfuse {
namespace {

// A MatMul the fused GEMM can run: A of rank >= 2 by constant 2-D weights of the same float
// dtype (f32; f16 and bf16 where the target runs them: the CUDA target's cuBLAS calls).
bool IsProjection(const Node* n) {
  if (!n->is(op::MatMul)) return false;
  const Value* a = n->input(0);
  const Value* b = n->input(1);
  return a && b && IsFloat(a->dtype()) && b->dtype() == a->dtype() && a->shape().size() >= 2 &&
         b->shape().size() == 2 && b->constant() != nullptr;
}

bool IsElementwiseNode(const Node* n) { return n->is(op::FusedElementwise) || match::IsElementwiseOp(*n); }

bool Excluded(const FusionOptions& o, const Node* n) { return o.exclude.count(n->name()) != 0; }

// Copies node `n` into `dst` with inputs mapped through `vmap` (a FusedElementwise node is
// inlined: its body's ops are copied, not the group), and maps n's outputs.
Status InlineInto(Graph& dst, const Node& n, std::map<const Value*, Value*>& vmap) {
  auto mapped = [&](const Value* v) -> Result<Value*> {
    if (!v) return static_cast<Value*>(nullptr);
    auto it = vmap.find(v);
    if (it == vmap.end()) return Internal("FuseGemm: value '", v->name(), "' read by '", n.name(), "' is not mapped");
    return it->second;
  };
  if (const Graph* body = n.is(op::FusedElementwise) ? n.GetGraph("body") : nullptr) {
    std::map<const Value*, Value*> inner;
    for (size_t i = 0; i < body->inputs().size(); ++i) {
      GF_ASSIGN_OR_RETURN(inner[body->inputs()[i]], mapped(n.input(i)));
    }
    for (const auto& bn : body->nodes()) {
      std::vector<Value*> ins;
      for (const Value* v : bn->inputs()) {
        if (v && v->constant()) {
          if (!inner.count(v)) {
            GF_ASSIGN_OR_RETURN(inner[v], dst.AddConstant(dst.FreshName(v->name()), v->constant()));
          }
        }
        ins.push_back(v ? inner.at(v) : nullptr);
      }
      GF_ASSIGN_OR_RETURN(Node * c, dst.AddNode(bn->op(), ins, bn->attrs(), bn->name()));
      for (size_t k = 0; k < bn->outputs().size(); ++k) inner[bn->output(k)] = c->output(k);
    }
    for (size_t k = 0; k < n.outputs().size(); ++k) vmap[n.output(k)] = inner.at(body->outputs()[k]);
    return Status::Ok();
  }
  std::vector<Value*> ins;
  for (const Value* v : n.inputs()) {
    if (v && v->constant() && !vmap.count(v)) {
      GF_ASSIGN_OR_RETURN(vmap[v], dst.AddConstant(dst.FreshName(v->name()), v->constant()));
    }
    GF_ASSIGN_OR_RETURN(Value * m, mapped(v));
    ins.push_back(m);
  }
  GF_ASSIGN_OR_RETURN(Node * c, dst.AddNode(n.op(), ins, n.attrs(), n.name()));
  for (size_t k = 0; k < n.outputs().size(); ++k) vmap[n.output(k)] = c->output(k);
  return Status::Ok();
}

class GemmFuser {
 public:
  GemmFuser(Graph& g, const FusionOptions& o, FusionReport* r) : g_(g), options_(o), report_(r) {}

  Result<int> Run() {
    // Horizontal groups: projections of the same activation with the same N, in graph order.
    std::vector<std::vector<Node*>> groups;
    std::map<std::pair<const Value*, int64_t>, size_t> index;
    for (const auto& n : g_.nodes()) {
      if (!IsProjection(n.get()) || Excluded(options_, n.get())) continue;
      const auto key = std::make_pair(static_cast<const Value*>(n->input(0)), n->input(1)->shape()[1]);
      auto it = index.find(key);
      if (it == index.end() || groups[it->second].size() >= kMaxProjections) {
        index[key] = groups.size();
        groups.push_back({n.get()});
      } else {
        groups[it->second].push_back(n.get());
      }
    }
    int formed = 0;
    for (const auto& projections : groups) {
      GF_ASSIGN_OR_RETURN(bool fused, FuseGroup(projections));
      formed += fused;
    }
    if (formed) GF_RETURN_IF_ERROR(g_.TopologicalSort());
    return formed;
  }

 private:
  static constexpr size_t kMaxProjections = 8;

  // The elementwise readers of the projections that can run as the epilogue.
  std::vector<Node*> EpilogueMembers(const std::vector<Node*>& projections, const Shape& out_shape) {
    std::set<const Value*> proj_values;
    for (Node* p : projections) proj_values.insert(p->output());
    std::vector<Node*> members;
    for (const auto& n : g_.nodes()) {  // graph order
      bool reads = false;
      for (const Value* v : n->inputs()) reads |= v && proj_values.count(v);
      if (!reads) continue;
      const Node* producer = nullptr;
      for (const Value* v : n->inputs())
        if (v && proj_values.count(v)) producer = v->producer();
      if (!IsElementwiseNode(n.get())) continue;  // attention, norms, ...: they read the output
      if (Excluded(options_, n.get())) {
        Refuse(report_, producer, n.get(), refusal::kExcluded, StrCat("'", n->name(), "' is excluded from fusion"));
        continue;
      }
      bool same_space = true;
      for (const Value* o : n->outputs()) same_space &= o->shape() == out_shape;
      if (!same_space) {
        Refuse(report_, producer, n.get(), refusal::kShapeMismatch,
               StrCat("'", n->name(), "' iterates over ", ShapeToString(n->output()->shape()), ", the GEMM '",
                      producer->name(), "' produces ", ShapeToString(out_shape)));
        continue;
      }
      members.push_back(n.get());
    }
    // Drop (until stable) members that read another member's result, or whose other operands
    // are computed from the group's results by a node outside it: fusing them would make a cycle.
    for (bool changed = true; changed;) {
      changed = false;
      std::set<const Node*> in_group(projections.begin(), projections.end());
      in_group.insert(members.begin(), members.end());
      std::vector<const Node*> all(projections.begin(), projections.end());
      all.insert(all.end(), members.begin(), members.end());
      const std::set<const Node*> downstream = match::ReachableFrom(all, in_group);
      for (size_t i = 0; i < members.size(); ++i) {
        const Node* bad = nullptr;
        for (const Value* v : members[i]->inputs()) {
          const Node* p = v ? v->producer() : nullptr;
          if (p && p != members[i] && (downstream.count(p) ||
                                      (in_group.count(p) && std::find(projections.begin(), projections.end(), p) ==
                                                                projections.end())))
            bad = p;
        }
        if (bad) {
          Refuse(report_, projections.front(), members[i], refusal::kWouldCreateCycle,
                 StrCat("'", members[i]->name(), "' also reads '", bad->name(),
                        "', which is computed after the GEMM outside the epilogue"));
          members.erase(members.begin() + static_cast<long>(i));
          changed = true;
          break;
        }
      }
    }
    return members;
  }

  Result<bool> FuseGroup(const std::vector<Node*>& projections, bool with_epilogue = true) {
    const Value* a = projections.front()->input(0);
    const int64_t k = a->shape().back(), n = projections.front()->input(1)->shape()[1];
    const int64_t S = static_cast<int64_t>(projections.size());
    const Shape out_shape = projections.front()->output()->shape();
    std::vector<Node*> members = with_epilogue ? EpilogueMembers(projections, out_shape) : std::vector<Node*>{};
    if (S == 1 && members.empty()) return false;  // a lone GEMM: nothing to fuse

    std::set<const Node*> absorbed(members.begin(), members.end());
    std::set<const Value*> proj_values;
    for (Node* p : projections) proj_values.insert(p->output());
    // Extra inputs of the epilogue, in first-read order.
    std::vector<Value*> extras;
    for (Node* m : members)
      for (Value* v : m->inputs())
        if (v && !proj_values.count(v) && std::find(extras.begin(), extras.end(), v) == extras.end()) extras.push_back(v);

    // The epilogue graph: projections and extras as inputs, the members' ops inlined.
    auto epilogue = std::make_shared<Graph>("epilogue");
    std::map<const Value*, Value*> emap;
    for (int64_t s = 0; s < S; ++s) {
      GF_ASSIGN_OR_RETURN(emap[projections[s]->output()],
                          epilogue->AddInput(StrCat("p", s), projections[s]->output()->dtype(), out_shape));
    }
    for (size_t e = 0; e < extras.size(); ++e) {
      GF_ASSIGN_OR_RETURN(emap[extras[e]], epilogue->AddInput(StrCat("in", e), extras[e]->dtype(), extras[e]->shape()));
    }
    for (Node* m : members) GF_RETURN_IF_ERROR(InlineInto(*epilogue, *m, emap));
    std::vector<const Value*> epi_outputs;
    for (Node* m : members)
      for (const Value* o : m->outputs())
        if (match::IsUsedOutside(o, absorbed)) epi_outputs.push_back(o);
    for (const Value* o : epi_outputs) GF_RETURN_IF_ERROR(epilogue->MarkOutput(emap.at(o)));
    // The epilogue must be one elementwise body within its limits (inputs, instructions, outputs).
    if (!members.empty()) {
      const Status fits = CheckElementwiseBody(*epilogue);
      if (!fits.ok()) {
        Refuse(report_, projections.front(), members.front(), refusal::kGroupTooLarge,
               StrCat("the epilogue does not fit one kernel: ", fits.message()));
        if (S == 1) return false;
        return FuseGroup(projections, /*with_epilogue=*/false);  // still one GEMM for all S
      }
    }

    // Weights: the projection's own constant, or the columns of all S side by side.
    Value* weights = projections.front()->input(1);
    if (S > 1) {
      const DType wt = projections.front()->input(1)->dtype();
      const size_t es = DTypeSize(wt);
      std::vector<const Tensor*> sources;
      for (int64_t s = 0; s < S; ++s) sources.push_back(projections[s]->input(1)->constant().get());
      GF_ASSIGN_OR_RETURN(auto cat, DeriveTensor(g_.prepared_store(), sources, "concat columns", [&]() -> Result<Tensor> {
        GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(wt, {k, S * n}));
        auto* dst = static_cast<char*>(t.data());
        for (int64_t s = 0; s < S; ++s) {
          const auto* src = static_cast<const char*>(sources[static_cast<size_t>(s)]->data());
          for (int64_t r = 0; r < k; ++r)
            std::copy(src + r * n * es, src + (r + 1) * n * es, dst + (r * S * n + s * n) * es);
        }
        return t;
      }));
      GF_ASSIGN_OR_RETURN(weights, g_.AddConstant(g_.FreshName(projections.front()->name() + "_weights_x" +
                                                               std::to_string(S)),
                                                  std::move(cat)));
    }

    // Outputs: projections still read outside the group, then the epilogue's results read outside.
    std::vector<int64_t> out_proj;
    std::vector<const Value*> old_outputs;
    for (int64_t s = 0; s < S; ++s)
      if (match::IsUsedOutside(projections[s]->output(), absorbed)) {
        out_proj.push_back(s);
        old_outputs.push_back(projections[s]->output());
      }
    for (const Value* o : epi_outputs) {
      out_proj.push_back(-1);
      old_outputs.push_back(o);
    }

    // The reference graph: the original ops on the fused node's inputs (for --check-fusion).
    auto reference = std::make_shared<Graph>("reference");
    std::map<const Value*, Value*> rmap;
    GF_ASSIGN_OR_RETURN(Value * ra, reference->AddInput("a", a->dtype(), a->shape()));
    GF_ASSIGN_OR_RETURN(Value * rw, reference->AddInput("w", weights->dtype(), weights->shape()));
    for (size_t e = 0; e < extras.size(); ++e) {
      GF_ASSIGN_OR_RETURN(rmap[extras[e]], reference->AddInput(StrCat("in", e), extras[e]->dtype(), extras[e]->shape()));
    }
    for (int64_t s = 0; s < S; ++s) {
      Value* ws = rw;
      if (S > 1) {
        auto ints = [&](const std::string& name, int64_t v) {
          auto t = std::make_shared<Tensor>(Tensor::Empty(DType::kI64, {1}).value());
          t->data_as<int64_t>()[0] = v;
          return reference->AddConstant(reference->FreshName(name), t);
        };
        GF_ASSIGN_OR_RETURN(Value * starts, ints("starts", s * n));
        GF_ASSIGN_OR_RETURN(Value * ends, ints("ends", (s + 1) * n));
        GF_ASSIGN_OR_RETURN(Value * axes, ints("axes", 1));
        GF_ASSIGN_OR_RETURN(Node * slice, reference->AddNode("Slice", {rw, starts, ends, axes}, {},
                                                           projections[s]->name() + "/weights"));
        ws = slice->output();
      }
      GF_ASSIGN_OR_RETURN(Node * mm, reference->AddNode("MatMul", {ra, ws}, {}, projections[s]->name()));
      rmap[projections[s]->output()] = mm->output();
    }
    for (Node* m : members) GF_RETURN_IF_ERROR(InlineInto(*reference, *m, rmap));
    for (const Value* o : old_outputs) GF_RETURN_IF_ERROR(reference->MarkOutput(rmap.at(o)));

    // Name: the GEMM's dims and what the epilogue does.
    std::string ops;
    int nops = 0;
    for (const auto& bn : epilogue->nodes()) {
      std::string op = bn->op();
      for (char& c : op) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (nops++ < 6) ops += "_" + op;
    }
    if (nops > 6) ops += StrCat("_and", nops - 6);
    const int64_t m = a->numel() / std::max<int64_t>(k, 1);
    FusedGroupInfo info;
    info.name = g_.FreshName("fused_gemm");
    info.kind = members.empty() ? "gemm_horizontal" : "gemm_epilogue";
    info.kernel_name = StrCat("gemm_", m, "x", S * n, "x", k, S > 1 ? StrCat("_split", S) : "", ops, "_",
                              DTypeName(a->dtype()), "_", KernelHash(*epilogue));
    for (Node* p : projections) info.nodes.push_back(p->name());
    for (Node* mem : members) {
      auto it = report_ ? std::find_if(report_->groups.begin(), report_->groups.end(),
                                       [&](const FusedGroupInfo& gi) { return gi.name == mem->name(); })
                        : std::vector<FusedGroupInfo>::iterator{};
      if (report_ && it != report_->groups.end()) {
        info.nodes.insert(info.nodes.end(), it->nodes.begin(), it->nodes.end());
        report_->groups.erase(it);
      } else {
        info.nodes.push_back(mem->name());
      }
    }

    std::vector<Value*> inputs = {const_cast<Value*>(a), weights};
    inputs.insert(inputs.end(), extras.begin(), extras.end());
    std::vector<ValueType> types;
    for (const Value* o : old_outputs) types.push_back({o->dtype(), o->shape()});
    schemas::FusedGemmAttrs gemm;
    gemm.splits = S;
    gemm.out_proj = std::move(out_proj);
    if (!members.empty()) gemm.epilogue = epilogue;
    AttributeMap attrs{{"kernel_name", info.kernel_name}, {"reference", std::shared_ptr<const Graph>(reference)}};
    gemm.WriteTo(attrs);
    Node* fused = g_.AddNodeTyped("FusedGemm", inputs, std::move(attrs), types, info.name);
    std::vector<std::string> names;
    for (size_t o = 0; o < old_outputs.size(); ++o) {
      names.push_back(old_outputs[o]->name());
      g_.ReplaceAllUsesWith(const_cast<Value*>(old_outputs[o]), fused->output(o));
    }
    for (auto it = members.rbegin(); it != members.rend(); ++it) g_.RemoveNode(*it);
    for (Node* p : projections) g_.RemoveNode(p);
    for (size_t o = 0; o < names.size(); ++o) GF_RETURN_IF_ERROR(g_.RenameValue(fused->output(o), names[o]));
    if (report_) {
      info.epilogue = FusedGemmEpilogueForm(*fused);
      report_->groups.push_back(std::move(info));
    }
    return true;
  }

  Graph& g_;
  FusionOptions options_;
  FusionReport* report_;
};

}  // namespace

Result<int> FuseGemm(Graph& g, const FusionOptions& options, FusionReport* report) {
  if (!options.enabled) return 0;
  return GemmFuser(g, options, report).Run();
}

}  // namespace graphfuse
