#include "passes/gemm_epilogue_form.h"

#include <algorithm>

#include "ir/op_registry.h"
#include "passes/match.h"

namespace graphfuse {
namespace gemm_epilogue {
namespace {

std::optional<BlockUnary> BlockUnaryOf(const Node& u) {
  const Result<OpKind> kind = OpFromName(u.op());
  if (!kind.ok() || u.inputs().size() != 1) return std::nullopt;
  const OpInfo& info = GetOpInfo(*kind);
  if (info.arity != 1 || (info.cls != OpClass::kArith && info.cls != OpClass::kActivation)) return std::nullopt;
  return BlockUnary{*kind, ElementwiseAttrs(*kind, u.attrs())};
}

std::optional<GatedEpilogue> GatedForm(const schemas::FusedGemmAttrs& attrs, const schemas::GemmGeometry& g) {
  const Graph* epi = attrs.epilogue.get();
  if (!epi || g.splits != 2 || attrs.out_proj != std::vector<int64_t>{-1} || epi->num_nodes() != 2 ||
      epi->inputs().size() != 2 || epi->outputs().size() != 1)
    return std::nullopt;
  const bool mul_last = epi->nodes().back()->is(op::Mul);  // the other node is then U
  const Node& u = mul_last ? *epi->nodes().front() : *epi->nodes().back();
  const Node& mul = mul_last ? *epi->nodes().back() : *epi->nodes().front();
  const std::optional<BlockUnary> unary = BlockUnaryOf(u);
  if (!unary || !mul.is(op::Mul) || mul.inputs().size() != 2) return std::nullopt;
  GatedEpilogue gate;
  gate.u = *unary;
  gate.act = u.input(0) == epi->inputs()[0] ? 0 : u.input(0) == epi->inputs()[1] ? 1 : -1;
  gate.mul = 1 - gate.act;
  if (gate.act < 0) return std::nullopt;
  const Value* ux = u.output();
  const Value* other = epi->inputs()[static_cast<size_t>(gate.mul)];
  for (const Value* v : std::initializer_list<const Value*>{ux, mul.output()})
    if (v->dtype() != DType::kF32 || v->shape() != g.out_shape) return std::nullopt;
  if (!match::HasOperands(mul, ux, other) || mul.output() != epi->outputs()[0]) return std::nullopt;
  return gate;
}

// Whether b is a bias of the GEMM's output: N f32 values along its last dim, broadcast over
// the rows.
bool IsRowBias(const Value* b, const schemas::GemmGeometry& g) {
  return b->dtype() == DType::kF32 && b->numel() == g.n && !b->shape().empty() && b->shape().back() == g.n &&
         b->shape().size() <= g.out_shape.size();
}

std::optional<StoreChain> StoreChainForm(const schemas::FusedGemmAttrs& attrs, const schemas::GemmGeometry& g) {
  constexpr size_t kMaxLinks = 4;
  const Graph* epi = attrs.epilogue.get();
  const std::vector<int64_t>& out_proj = attrs.out_proj;
  const size_t S = static_cast<size_t>(g.splits);
  if (!epi || out_proj != std::vector<int64_t>(S, -1) || epi->outputs().size() != S || epi->inputs().size() < S)
    return std::nullopt;
  const auto extras = epi->inputs().begin() + static_cast<std::ptrdiff_t>(S);
  StoreChain form;
  size_t adds = 0;
  for (size_t s = 0; s < S; ++s) {
    const Value* v = epi->inputs()[s];
    std::vector<StoreChain::Link> links;
    for (;;) {
      const auto out = std::find(epi->outputs().begin(), epi->outputs().end(), v);
      if (out != epi->outputs().end()) {  // the chain's end: read by nothing else
        if (links.empty() || !v->uses().empty()) return std::nullopt;
        form.output.push_back(out - epi->outputs().begin());
        break;
      }
      const Use* use = match::SingleUse(v);
      if (!use || links.size() == kMaxLinks) return std::nullopt;
      const Node& add = *use->node;
      if (!add.is(op::Add) || add.inputs().size() != 2 || add.outputs().size() != 1) return std::nullopt;
      const Value* x = match::OtherOperand(add, v);
      const auto at = std::find(extras, epi->inputs().end(), x);
      if (at == epi->inputs().end() || x->dtype() != DType::kF32) return std::nullopt;
      const bool full = x->shape() == g.out_shape;
      const Value* y = add.output();
      if ((!full && !IsRowBias(x, g)) || y->dtype() != DType::kF32 || y->shape() != g.out_shape) return std::nullopt;
      if (!full && !links.empty()) return std::nullopt;  // a bias only first: it is the matmul's
      links.push_back({2 + (at - extras), !full});
      ++adds;
      v = y;
    }
    form.links.push_back(std::move(links));
  }
  std::vector<int64_t> outs = form.output;
  std::sort(outs.begin(), outs.end());
  if (adds != epi->num_nodes() || std::adjacent_find(outs.begin(), outs.end()) != outs.end()) return std::nullopt;
  return form;
}

// The epilogue's part of FusedGemmEpilogueForm (without the folded RMSNorm's).
std::string EpilogueFormOf(const Node& node, const schemas::FusedGemmAttrs& attrs) {
  if (!attrs.epilogue || node.inputs().size() < 2) return "";
  const Result<schemas::GemmGeometry> g =
      schemas::Geometry(node.Describe(), node.input(0)->shape(), node.input(1)->shape(), attrs.splits);
  if (!g.ok()) return "";
  if (!node.input(1)->constant())
    return ResidualInput(node, *g) >= 0 ? "sgemm accumulates onto a copy of the residual"
                                        : "after the GEMMs, over whole rows (weights not constant)";
  const PackedForm form = PackedFormOf(node, *g);
  if (const auto& gate = form.gate)
    return StrCat("per block: ", OpName(gate->u.kind), " of projection ", gate->act,
                  " in place while in L2, then projection ", gate->mul, "'s GEMM multiplies by it as it stores");
  if (const auto& chain = form.chain) {
    std::string sums;
    for (size_t s = 0; s < chain->links.size(); ++s) {
      sums += s ? "; " : "";
      sums += chain->links.size() > 1 ? StrCat("p", s) : std::string("p");
      for (const StoreChain::Link& l : chain->links[s]) sums += l.row ? " + bias" : " + residual";
    }
    return "as the GEMM stores: " + sums;
  }
  if (const auto& ba = form.bias_act)
    return StrCat(ba->bias_input >= 0 ? "as the GEMM stores: p + bias; then " : "",
                  "per block, in place while in L2: ", ba->u ? OpName(ba->u->kind) : "");
  return "after the GEMMs, over whole rows";
}

}  // namespace

PackedForm PackedFormOf(const Node& node, const schemas::GemmGeometry& g) {
  const schemas::FusedGemmAttrs attrs = schemas::FusedGemmAttrs::Read(node);
  PackedForm f;
  f.gate = GatedForm(attrs, g);
  if (attrs.row_scale >= 0) return f;
  if (!f.gate) f.chain = StoreChainForm(attrs, g);
  if (!f.gate && !f.chain) f.bias_act = BiasActForm(node, g);
  return f;
}

std::optional<BiasActEpilogue> BiasActForm(const Node& node, const schemas::GemmGeometry& g) {
  const schemas::FusedGemmAttrs attrs = schemas::FusedGemmAttrs::Read(node);
  const Graph* epi = attrs.epilogue.get();
  if (!epi || g.splits != 1 || attrs.out_proj != std::vector<int64_t>{-1} || epi->outputs().size() != 1 ||
      epi->num_nodes() < 1 || epi->num_nodes() > 2 || epi->inputs().empty() || epi->inputs().size() > 2)
    return std::nullopt;
  const Value* p = epi->inputs()[0];
  const Node* add = nullptr;  // p + bias
  const Node* u = nullptr;    // U
  for (const auto& nd : epi->nodes()) (nd->is(op::Add) && !add ? add : u) = nd.get();
  BiasActEpilogue form;
  const Value* at = p;  // the value U must read: p, or p + bias
  if (add) {
    if (epi->inputs().size() != 2 || add->inputs().size() != 2) return std::nullopt;
    const Value* b = epi->inputs()[1];
    if (!match::HasOperands(*add, p, b) || !IsRowBias(b, g)) return std::nullopt;
    form.bias_input = 2;
    at = add->output();
  } else if (epi->inputs().size() != 1) {
    return std::nullopt;
  }
  if (u) {
    form.u = BlockUnaryOf(*u);
    if (!form.u || u->input(0) != at) return std::nullopt;
    at = u->output();
  }
  if (at != epi->outputs()[0] || at->dtype() != DType::kF32 || at->shape() != g.out_shape || p->dtype() != DType::kF32)
    return std::nullopt;
  return form;
}

int64_t ResidualInput(const Node& node, const schemas::GemmGeometry& g) {
  const schemas::FusedGemmAttrs attrs = schemas::FusedGemmAttrs::Read(node);
  const Graph* epi = attrs.epilogue.get();
  if (!epi || g.splits != 1 || attrs.out_proj != std::vector<int64_t>{-1} || epi->num_nodes() != 1 ||
      epi->inputs().size() != 2 || epi->outputs().size() != 1 || attrs.row_scale >= 0)
    return -1;
  const Node& add = *epi->nodes().front();
  if (!add.is(op::Add) || add.inputs().size() != 2 || add.outputs()[0] != epi->outputs()[0]) return -1;
  const Value* r = epi->inputs()[1];
  if (!match::HasOperands(add, epi->inputs()[0], r) || r->dtype() != DType::kF32 || r->shape() != g.out_shape ||
      add.outputs()[0]->dtype() != DType::kF32)
    return -1;
  return 2;
}

}  // namespace gemm_epilogue

std::string FusedGemmEpilogueForm(const Node& node) {
  const schemas::FusedGemmAttrs attrs = schemas::FusedGemmAttrs::Read(node);
  std::string form = gemm_epilogue::EpilogueFormOf(node, attrs);
  if (attrs.row_scale >= 0)
    form = StrCat("each projection times its row's 1/rms (a folded RMSNorm)", form.empty() ? "" : "; ", form);
  if (attrs.rms_epsilon) {
    const Result<schemas::GemmGeometry> g =
        schemas::Geometry(node.Describe(), node.input(0)->shape(), node.input(1)->shape(), attrs.splits);
    const bool chain = g.ok() && node.input(1)->constant() && gemm_epilogue::PackedFormOf(node, *g).chain.has_value();
    form += StrCat(form.empty() ? "" : "; ", "each row's 1/rms of the output for the next GEMM (a folded RMSNorm), ",
                   chain ? "per block while in L2" : "after the GEMMs");
  }
  return form;
}

}  // namespace graphfuse
