// FoldNormIntoGemm: an RMSNorm between two GEMMs runs inside them, not as a kernel of its own.
//
//   %h = FusedGemm(%a, %W1, ...)                     %h, %s = FusedGemm(%a, %W1, ...) {rms_epsilon = eps}
//   %y = RMSNorm(%h, %gamma) {epsilon = eps}   ==>
//   %z = FusedGemm(%y, %W2, ...)                     %z = FusedGemm(%h, %W2g, ..., %s) {row_scale}
//
// y W2 = diag(s) h diag(gamma) W2 with s = 1 / sqrt(mean(h^2) + eps) per row, so:
//  - the producer also writes s ([..., 1]): a store chain (LLaMA's o_proj + residual) sums each
//    row's squares block by block while the block it just stored is in L2, and the h that
//    RMSNorm read back from memory or from the other core's cache is not read again;
//  - the consumer's weights take gamma (W2g = diag(gamma) W2, a constant made here, packed
//    once) and each of its projections is scaled by its row's s before anything reads it (the
//    gated form folds that into its per-block pass: s * U(s * p_act) times p_mul);
//  - y never exists: neither its write nor its read, nor the launch.
// The bits differ from the unfused plan's by the products' rounding (h * (gamma * w) against
// (h * s * gamma) * w, then * s): a few ulps of each projection, as for any reassociated GEMM.
//
// The same norm before a projected attention (LLaMA's input norm: FuseAttentionProjections'
// form, reading x and W itself) folds into the attention alone: it takes the norm's input x
// and W with the norm's scale (rms_epsilon), computes each row's 1/rms before its heads and
// scales each row of q, k and v by it, before the biases when it adds them (attention.cc).
//
// Conditions: the norm is over the last dim; gamma is absent or a constant of one value per
// column (or one value); y is not a graph output and every reader of y is a FusedGemm taking it
// as A with constant weights, h then being output 0 of a FusedGemm; or y's one reader is a
// projected attention taking it as x with constant W. Other norms stay kernels (the
// FuseRowwise pass may still take them). The nodes keep their names; each carries a reference
// graph of what it replaced (the producer: its old node and s in primitive ops; a consumer:
// Mul(h, s) and its old node), which `run --check-fusion` runs and a backend without the form
// would run instead. Runs where the Target asks for it (TargetForms::norm_into_gemm: the CPU).
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/prepared_store.h"
#include "ir/schemas/attention_layout.h"
#include "ir/schemas/fused_gemm.h"
#include "passes/fusion_passes.h"
#include "passes/pass_manager.h"
#include "passes/gemm_epilogue_form.h"
#include "passes/match.h"

namespace graphfuse {
namespace {

Result<std::shared_ptr<Tensor>> ScalarF32(float v) {
  GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kF32, {1}));
  t.data_as<float>()[0] = v;
  return std::make_shared<Tensor>(std::move(t));
}

// A reference graph's inputs, one for each of `values` (a node's inputs), in order.
Result<std::vector<Value*>> ReferenceInputs(Graph& ref, const std::vector<Value*>& values) {
  std::vector<Value*> in;
  for (const Value* v : values) {
    GF_ASSIGN_OR_RETURN(Value * r, ref.AddInput(ref.FreshName(v->name()), v->dtype(), v->shape()));
    in.push_back(r);
  }
  return in;
}

std::vector<std::string> OutputNames(const Node& n) {
  std::vector<std::string> names;
  for (const Value* o : n.outputs()) names.push_back(o->name());
  return names;
}

// The RMSNorm's scale when it can go into W's rows: empty for none (1), else K values.
std::optional<std::vector<float>> FoldableScale(const Node& norm, int64_t k) {
  if (norm.inputs().size() < 2 || !norm.input(1)) return std::vector<float>{};
  std::optional<std::vector<float>> g = match::F32Constant(norm.input(1));
  const int64_t n = g ? static_cast<int64_t>(g->size()) : 0;
  if (!g || (n != k && n != 1)) return std::nullopt;
  if (n == 1) g->assign(static_cast<size_t>(k), g->front());
  return g;
}

class NormFolder {
 public:
  NormFolder(Graph& g, const FusionOptions& o, FusionReport* r) : g_(g), options_(o), report_(r) {}

  Result<int> Run() {
    std::vector<Node*> norms;
    for (const auto& n : g_.nodes())
      if (n->is(op::RMSNorm)) norms.push_back(n.get());
    int folded = 0;
    for (Node* r : norms) {
      GF_ASSIGN_OR_RETURN(bool done, TryFold(r));
      folded += done;
    }
    if (folded == 0) return 0;
    GF_RETURN_IF_ERROR(g_.TopologicalSort());
    for (auto& [v, name] : renames_) GF_RETURN_IF_ERROR(g_.RenameValue(v, name));
    return folded;
  }

 private:
  // The norm's scale for W's rows (FoldableScale), else a refusal naming `reader`.
  std::optional<std::vector<float>> ScaleOrRefuse(const Node& norm, int64_t k, const Node& reader) {
    std::optional<std::vector<float>> gamma = FoldableScale(norm, k);
    if (!gamma)
      Refuse(report_, norm, reader, refusal::kNormNotFoldable,
             "the RMSNorm stays a kernel: its scale is not a constant of one value per column");
    return gamma;
  }

  // The report's group of the node named `name`, or null.
  FusedGroupInfo* Group(const std::string& name) {
    if (report_)
      for (FusedGroupInfo& gi : report_->groups)
        if (gi.name == name) return &gi;
    return nullptr;
  }

  // Fresh names for a replacement of `n`'s outputs (n's own, given back by Run's renames).
  std::vector<std::string> FreshOutputNames(const Node& n) {
    std::vector<std::string> names = OutputNames(n);
    for (std::string& nm : names) nm = g_.FreshName(nm);
    return names;
  }

  // `now` takes the place of `old` for every reader of old's outputs (and, after Run, their names).
  void TakeOver(const Node& old, Node& now) {
    for (size_t o = 0; o < old.outputs().size(); ++o) {
      g_.ReplaceAllUsesWith(old.output(o), now.output(o));
      renames_.push_back({now.output(o), old.output(o)->name()});
    }
  }

  Result<bool> TryFold(Node* norm) {
    Value* h = norm->input(0);
    Value* y = norm->output();
    if (!h || h->dtype() != DType::kF32 || h->shape().size() < 2 || h->shape().back() == 0 || y->is_graph_output() ||
        y->uses().empty())
      return false;
    if (!match::IsLastAxis(norm->GetInt("axis", -1), h->shape().size())) return false;
    if (const Use* u = match::SingleUse(y); u && u->node->is(op::FusedAttention)) return TryFoldIntoAttention(norm);
    Node* p = match::ProducerOf(h, op::FusedGemm);
    if (!p || p->output(0) != h || schemas::FusedGemmAttrs::Read(*p).rms_epsilon) return false;
    const int64_t k = h->shape().back();
    std::vector<Node*> consumers;
    for (const Use& u : y->uses()) {
      Node* c = u.node;
      if (!c->is(op::FusedGemm) || u.input_index != 0 || !c->input(1)->constant() ||
          c->input(1)->shape().size() != 2 || c->input(1)->shape()[0] != k ||
          schemas::FusedGemmAttrs::Read(*c).row_scale >= 0 ||
          std::count(c->inputs().begin(), c->inputs().end(), y) != 1)
        return false;
      if (std::find(consumers.begin(), consumers.end(), c) == consumers.end()) consumers.push_back(c);
    }
    for (const Node* n : {p, norm})
      if (options_.exclude.count(n->name())) {
        Refuse(report_, *p, *norm, refusal::kExcluded, "the RMSNorm stays a kernel: it or the GEMM before it is excluded");
        return false;
      }
    for (const Node* c : consumers)
      if (options_.exclude.count(c->name())) {
        Refuse(report_, *norm, *c, refusal::kExcluded, "the RMSNorm stays a kernel: a GEMM reading it is excluded");
        return false;
      }
    const std::optional<std::vector<float>> gamma = ScaleOrRefuse(*norm, k, *consumers.front());
    if (!gamma) return false;
    const float eps = norm->GetFloat("epsilon", 1e-6f);

    // The producer: its node as it was, plus s, in its reference.
    GF_ASSIGN_OR_RETURN(Node * np, NewProducer(*p, eps));
    Value* s = np->outputs().back();
    TakeOver(*p, *np);
    // h is now np's output 0: the consumers read it (and s) in place of y.
    Value* hn = np->output(0);
    for (Node* c : consumers) {
      GF_ASSIGN_OR_RETURN(Node * nc, NewConsumer(*c, hn, s, *gamma, *norm));
      TakeOver(*c, *nc);
      g_.RemoveNode(c);
    }
    g_.RemoveNode(norm);
    g_.RemoveNode(p);
    g_.RemoveDeadNodes();
    return true;
  }

  // The norm before a projected attention (LLaMA's input norm): the attention takes x itself,
  // W with the norm's scale, and each row's 1/rms, which it computes before its heads.
  Result<bool> TryFoldIntoAttention(Node* norm) {
    Value* h = norm->input(0);
    Node* a = norm->output()->uses()[0].node;
    const int64_t k = h->shape().back();
    if (norm->output()->uses()[0].input_index != 0 || a->GetInt("qkv_proj", 0) == 0 ||
        schemas::AttentionRmsEpsilon(a->attrs()) || !a->input(1)->constant() || a->input(1)->shape().size() != 2 ||
        a->input(1)->shape()[0] != k)
      return false;
    if (options_.exclude.count(norm->name()) || options_.exclude.count(a->name())) {
      Refuse(report_, *norm, *a, refusal::kExcluded, "the RMSNorm stays a kernel: it or the attention reading it is excluded");
      return false;
    }
    const std::optional<std::vector<float>> gamma = ScaleOrRefuse(*norm, k, *a);
    if (!gamma) return false;
    const float eps = norm->GetFloat("epsilon", 1e-6f);
    GF_ASSIGN_OR_RETURN(Value * w, ScaledWeights(a->input(1), *gamma, *norm));
    std::vector<Value*> inputs = {h, w};
    for (size_t i = 2; i < a->inputs().size(); ++i) inputs.push_back(a->input(i));

    // The reference: the 1/rms in primitive ops, x times it, then the attention as it was.
    auto ref = std::make_shared<Graph>(a->name());
    GF_ASSIGN_OR_RETURN(std::vector<Value*> in, ReferenceInputs(*ref, inputs));
    GF_ASSIGN_OR_RETURN(Value * inv, InvRms(*ref, in[0], eps, norm->name()));
    GF_ASSIGN_OR_RETURN(Node * scaled, ref->AddNode("Mul", {in[0], inv}, {}, norm->name() + "/folded"));
    std::vector<Value*> old_in = in;
    old_in[0] = scaled->output();
    GF_ASSIGN_OR_RETURN(Node * old, ref->AddNode("FusedAttention", old_in, a->attrs(), a->name(), -1, OutputNames(*a)));
    GF_RETURN_IF_ERROR(ref->MarkOutput(old->output()));

    AttributeMap attrs = a->attrs();
    schemas::SetAttentionRmsEpsilon(attrs, eps);
    attrs["kernel_name"] = StrCat("rmsnorm_", a->GetString("kernel_name", "attention"));
    attrs["reference"] = std::shared_ptr<const Graph>(ref);
    GF_ASSIGN_OR_RETURN(Node * na, g_.AddNode("FusedAttention", inputs, std::move(attrs), a->name(), -1,
                                             FreshOutputNames(*a)));
    TakeOver(*a, *na);
    if (FusedGroupInfo* gi = Group(a->name())) {
      gi->nodes.insert(gi->nodes.begin(), norm->name());
      gi->kernel_name = na->GetString("kernel_name", gi->kernel_name);
    }
    g_.RemoveNode(a);
    g_.RemoveNode(norm);
    g_.RemoveDeadNodes();
    return true;
  }

  // 1 / sqrt(mean(x^2, last dim) + eps) in primitive ops, [..., 1].
  static Result<Value*> InvRms(Graph& ref, Value* x, float eps, const std::string& scope) {
    GF_ASSIGN_OR_RETURN(Node * sq, ref.AddNode("Mul", {x, x}, {}, scope + "/rms/square"));
    GF_ASSIGN_OR_RETURN(
        Node * mean, ref.AddNode("ReduceMean", {sq->output()},
                                 {{"axes", std::vector<int64_t>{-1}}, {"keepdims", int64_t{1}}}, scope + "/rms/mean"));
    GF_ASSIGN_OR_RETURN(auto eps_t, ScalarF32(eps));
    GF_ASSIGN_OR_RETURN(Value * eps_v, ref.AddConstant(ref.FreshName("epsilon"), eps_t));
    GF_ASSIGN_OR_RETURN(Node * add, ref.AddNode("Add", {mean->output(), eps_v}, {}, scope + "/rms/add"));
    GF_ASSIGN_OR_RETURN(Node * root, ref.AddNode("Sqrt", {add->output()}, {}, scope + "/rms/sqrt"));
    GF_ASSIGN_OR_RETURN(Node * inv, ref.AddNode("Reciprocal", {root->output()}, {}, scope + "/rms/inv"));
    return inv->output();
  }

  // W's row i times gamma[i] (W itself when gamma is empty), a new constant.
  Result<Value*> ScaledWeights(Value* w, const std::vector<float>& gamma, const Node& norm) {
    if (gamma.empty()) return w;
    const Tensor& src = *w->constant();
    // Keyed on the norm's scale tensor too: gamma holds its values.
    const Tensor* sources[] = {&src, norm.input(1)->constant().get()};
    GF_ASSIGN_OR_RETURN(auto scaled, DeriveTensor(g_.prepared_store(), sources, "rows times the norm's scale",
                                                  [&]() -> Result<Tensor> {
      GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kF32, src.shape()));
      const int64_t rows = src.shape()[0], cols = src.shape()[1];
      const float* a = src.data_as<float>();
      float* b = t.data_as<float>();
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) b[i * cols + j] = a[i * cols + j] * gamma[static_cast<size_t>(i)];
      return t;
    }));
    return g_.AddConstant(g_.FreshName(w->name() + "_times_" + norm.name()), std::move(scaled));
  }

  Result<Node*> NewProducer(const Node& p, float eps) {
    auto ref = std::make_shared<Graph>(p.name());
    GF_ASSIGN_OR_RETURN(std::vector<Value*> in, ReferenceInputs(*ref, p.inputs()));
    GF_ASSIGN_OR_RETURN(Node * old, ref->AddNode("FusedGemm", in, p.attrs(), p.name(), -1, OutputNames(p)));
    GF_ASSIGN_OR_RETURN(Value * inv, InvRms(*ref, old->output(0), eps, p.name()));
    for (const Value* o : old->outputs()) GF_RETURN_IF_ERROR(ref->MarkOutput(const_cast<Value*>(o)));
    GF_RETURN_IF_ERROR(ref->MarkOutput(inv));

    AttributeMap attrs = p.attrs();
    schemas::FusedGemmAttrs gemm = schemas::FusedGemmAttrs::Read(attrs);
    gemm.rms_epsilon = eps;
    gemm.WriteTo(attrs);
    attrs["kernel_name"] = StrCat(p.GetString("kernel_name", "gemm"), "_rms");
    attrs["reference"] = std::shared_ptr<const Graph>(ref);
    std::vector<std::string> names = FreshOutputNames(p);
    names.push_back(g_.FreshName(p.output(0)->name() + "_inv_rms"));
    GF_ASSIGN_OR_RETURN(Node * np, g_.AddNode("FusedGemm", p.inputs(), std::move(attrs), p.name(), -1, names));
    if (FusedGroupInfo* gi = Group(p.name())) {
      gi->kernel_name = np->GetString("kernel_name", gi->kernel_name);
      gi->epilogue = FusedGemmEpilogueForm(*np);
    }
    return np;
  }

  Result<Node*> NewConsumer(const Node& c, Value* h, Value* s, const std::vector<float>& gamma, const Node& norm) {
    GF_ASSIGN_OR_RETURN(Value * w, ScaledWeights(c.input(1), gamma, norm));
    std::vector<Value*> inputs = {h, w};
    for (size_t i = 2; i < c.inputs().size(); ++i) inputs.push_back(c.input(i));
    inputs.push_back(s);

    auto ref = std::make_shared<Graph>(c.name());
    GF_ASSIGN_OR_RETURN(std::vector<Value*> in, ReferenceInputs(*ref, inputs));
    GF_ASSIGN_OR_RETURN(Node * scaled, ref->AddNode("Mul", {in[0], in.back()}, {}, norm.name() + "/folded"));
    std::vector<Value*> old_in = {scaled->output(), in[1]};
    old_in.insert(old_in.end(), in.begin() + 2, in.end() - 1);
    GF_ASSIGN_OR_RETURN(Node * old, ref->AddNode("FusedGemm", old_in, c.attrs(), c.name(), -1, OutputNames(c)));
    for (const Value* o : old->outputs()) GF_RETURN_IF_ERROR(ref->MarkOutput(const_cast<Value*>(o)));

    AttributeMap attrs = c.attrs();
    schemas::FusedGemmAttrs gemm = schemas::FusedGemmAttrs::Read(attrs);
    gemm.row_scale = static_cast<int64_t>(inputs.size() - 1);
    gemm.WriteTo(attrs);
    attrs["kernel_name"] = StrCat(c.GetString("kernel_name", "gemm"), "_rmsnorm");
    attrs["reference"] = std::shared_ptr<const Graph>(ref);
    GF_ASSIGN_OR_RETURN(Node * nc,
                        g_.AddNode("FusedGemm", inputs, std::move(attrs), c.name(), -1, FreshOutputNames(c)));
    if (FusedGroupInfo* gi = Group(c.name())) {
      gi->nodes.insert(gi->nodes.begin(), norm.name());
      gi->kernel_name = nc->GetString("kernel_name", gi->kernel_name);
      gi->epilogue = FusedGemmEpilogueForm(*nc);
    }
    return nc;
  }

  Graph& g_;
  FusionOptions options_;
  FusionReport* report_;
  std::vector<std::pair<Value*, std::string>> renames_;
};

}  // namespace

Result<int> FoldNormIntoGemm(Graph& g, const FusionOptions& options, FusionReport* report) {
  if (!options.enabled || !options.norm_into_gemm) return 0;
  return NormFolder(g, options, report).Run();
}

}  // namespace graphfuse
