// FuseAttentionProjections: the QKV projection GEMM(s) that only feed a FusedAttention move
// into it (the projected form; kernel: src/cpu/kernels/attention.cc). A pass of its own, after
// FuseGemm, for the targets whose forms ask for it (TargetForms::attention_projection).
#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "core/prepared_store.h"
#include "core/hash.h"
#include "ir/op_registry.h"
#include "ir/text.h"
#include "ir/schemas/attention_layout.h"
#include "ir/schemas/fused_gemm.h"
#include "passes/fusion_legality.h"
#include "passes/fusion_passes.h"
#include "passes/pass_manager.h"
#include "passes/match.h"
#include "passes/reference_graph.h"

namespace graphfuse {

namespace {

constexpr const char* kUnsupportedLayout = refusal::kAttentionUnsupportedLayout;
using match::ProducerOf;

// What the projected form takes of a FusedGemm: per output, the projection (column block of W)
// it is; and per projection its bias when the epilogue adds one to each projection and does
// nothing else (p_s + b_s, either operand order; b_s a constant f32 of N values along the last
// dim: GPT-2's, BERT's, Qwen2's and nn.MultiheadAttention's in-projection). None for any other
// epilogue.
struct GemmProjections {
  int64_t splits = 0, n = 0;  // projections of N columns each
  std::vector<int64_t> proj_of_output;
  std::vector<Value*> bias_inputs;  // per projection: the node input holding its bias (empty without)
};

std::optional<GemmProjections> GemmProjectionsOf(const Node& gemm) {
  const schemas::FusedGemmAttrs attrs = schemas::FusedGemmAttrs::Read(gemm);
  const int64_t splits = attrs.splits;
  const std::vector<int64_t>& out_proj = attrs.out_proj;
  if (splits < 1 || gemm.inputs().size() < 2 || !gemm.input(1) || gemm.input(1)->shape().size() != 2 ||
      out_proj.size() != gemm.outputs().size() || attrs.row_scale >= 0 || attrs.rms_epsilon)
    return std::nullopt;
  const int64_t n = gemm.input(1)->shape()[1] / splits;
  GemmProjections form{splits, n, {}, {}};
  const Graph* epilogue = attrs.epilogue.get();
  if (!epilogue) {
    if (gemm.inputs().size() != 2) return std::nullopt;
    form.proj_of_output = out_proj;
    return form;
  }
  // Every output an epilogue output, each one Add of a projection and a bias input.
  if (epilogue->nodes().size() != static_cast<size_t>(splits) || out_proj.size() != static_cast<size_t>(splits) ||
      epilogue->outputs().size() != out_proj.size() ||
      epilogue->inputs().size() != gemm.inputs().size() - 2 + static_cast<size_t>(splits))
    return std::nullopt;
  form.bias_inputs.assign(static_cast<size_t>(splits), nullptr);
  for (size_t o = 0; o < out_proj.size(); ++o) {
    const Node* add = epilogue->outputs()[o]->producer();
    if (out_proj[o] != -1 || !add || !add->is(op::Add)) return std::nullopt;
    int64_t proj = -1;
    Value* bias = nullptr;
    for (auto [p, b] : match::OperandOrders(*add)) {
      const auto& ins = epilogue->inputs();
      const auto pi = std::find(ins.begin(), ins.end(), p) - ins.begin();
      const auto bi = std::find(ins.begin(), ins.end(), b) - ins.begin();
      if (pi < splits && bi >= splits && bi < static_cast<long>(ins.size())) {
        proj = pi;
        bias = gemm.input(static_cast<size_t>(2 + bi - splits));
        break;
      }
    }
    if (proj < 0 || form.bias_inputs[static_cast<size_t>(proj)] || !bias || !bias->constant() ||
        bias->dtype() != DType::kF32 || bias->numel() != n || bias->shape().empty() || bias->shape().back() != n)
      return std::nullopt;
    form.bias_inputs[static_cast<size_t>(proj)] = bias;
    form.proj_of_output.push_back(proj);
  }
  return form;
}

// What the projected form takes of a QKV FusedGemm: GemmProjections of three, with its biases
// in W's column order as one [3N] constant.
struct QkvGemmForm {
  std::vector<int64_t> proj_of_output;
  std::shared_ptr<const Tensor> bias;  // [3N], or null without an epilogue
  std::vector<Value*> bias_inputs;     // per projection: the node input holding its bias
};

std::optional<QkvGemmForm> QkvFormOf(const Node& gemm) {
  std::optional<GemmProjections> p = GemmProjectionsOf(gemm);
  if (!p || p->splits != 3) return std::nullopt;
  QkvGemmForm form{p->proj_of_output, nullptr, p->bias_inputs};
  if (form.bias_inputs.empty()) return form;
  const int64_t n = p->n;
  auto cat = std::make_shared<Tensor>(Tensor::Empty(DType::kF32, {3 * n}).value());
  for (int64_t s = 0; s < 3; ++s) {
    const float* b = form.bias_inputs[static_cast<size_t>(s)]->constant()->data_as<float>();
    std::copy(b, b + n, cat->data_as<float>() + s * n);
  }
  form.bias = std::move(cat);
  return form;
}

// In a reference graph: the GEMM's bias inputs (gemm inputs 2, ...) as slices of `bias`
// (projection s's N values at offset + s*N), each viewed with its own shape.
Result<std::vector<Value*>> BiasSlices(Graph& ref, Value* bias, const Node& gemm, const std::vector<Value*>& per_proj,
                                       int64_t offset, int64_t n) {
  std::vector<Value*> out;
  for (size_t i = 2; i < gemm.inputs().size(); ++i) {
    const Value* b = gemm.input(i);
    const int64_t s = std::find(per_proj.begin(), per_proj.end(), b) - per_proj.begin();
    if (s >= static_cast<int64_t>(per_proj.size()))
      return Internal(gemm.Describe(), ": input '", b->name(), "' is no projection's bias");
    GF_ASSIGN_OR_RETURN(Value * starts, match::AddIntsConstant(ref, "starts", {offset + s * n}));
    GF_ASSIGN_OR_RETURN(Value * ends, match::AddIntsConstant(ref, "ends", {offset + (s + 1) * n}));
    GF_ASSIGN_OR_RETURN(Node * slice, ref.AddNode("Slice", {bias, starts, ends}, {}, b->name() + "/slice"));
    Value* v = slice->output();
    if (v->shape() != b->shape()) {
      GF_ASSIGN_OR_RETURN(Value * shape,
                          match::AddIntsConstant(ref, "shape", std::vector<int64_t>(b->shape().begin(), b->shape().end())));
      GF_ASSIGN_OR_RETURN(Node * r, ref.AddNode("Reshape", {v, shape}, {}, b->name() + "/view"));
      v = r->output();
    }
    out.push_back(v);
  }
  return out;
}

// The report: the groups (or lone nodes) computing an attention's q, k and v join the
// attention's group, which takes the fused node's kernel name.
void JoinAttentionGroup(FusionReport* report, const std::string& attention, const std::vector<const Node*>& sources,
                        const std::string& kernel) {
  if (!report) return;
  std::vector<std::string> nodes;
  for (const Node* src : sources) {
    auto it = std::find_if(report->groups.begin(), report->groups.end(),
                           [&](const FusedGroupInfo& gi) { return gi.name == src->name(); });
    if (it == report->groups.end()) {
      nodes.push_back(src->name());
      continue;
    }
    nodes.insert(nodes.end(), it->nodes.begin(), it->nodes.end());
    report->groups.erase(it);
  }
  for (FusedGroupInfo& gi : report->groups)
    if (gi.name == attention) {
      gi.nodes.insert(gi.nodes.begin(), nodes.begin(), nodes.end());
      gi.kernel_name = kernel;
    }
}

// Replaces attention `a` by its projected form: a FusedAttention reading `inputs` with `attrs`
// and the reference graph `ref`; the projection GEMMs `sources` go with it (graph and report).
// The new node's output takes a's name once the pass is done (`renames`).
Status ReplaceWithProjectedAttention(Graph& g, Node* a, const std::vector<Value*>& inputs, AttributeMap attrs,
                                     std::shared_ptr<const Graph> ref, const std::vector<Node*>& sources,
                                     FusionReport* report, std::vector<std::pair<Value*, std::string>>& renames) {
  attrs["kernel_name"] = StrCat("qkv_", a->GetString("kernel_name", "attention"));
  attrs["reference"] = std::move(ref);
  const std::string name = a->name();
  GF_ASSIGN_OR_RETURN(Node * fused, g.AddNode("FusedAttention", inputs, std::move(attrs), name));
  if (fused->output()->shape() != a->output()->shape())
    return Internal(name, ": the projected form gives ", fused->output()->TypeString(), " in place of ",
                    a->output()->TypeString());
  renames.push_back({fused->output(), a->output()->name()});
  g.ReplaceAllUsesWith(a->output(), fused->output());
  JoinAttentionGroup(report, name, std::vector<const Node*>(sources.begin(), sources.end()),
                     fused->GetString("kernel_name", ""));
  g.RemoveNode(a);
  for (Node* s : sources) g.RemoveNode(s);
  return Status::Ok();
}

// One of q, k, v as a projection of x by constant f32 weights: a MatMul, or one output of a
// FusedGemm (GemmProjectionsOf), with the projection's bias when the GEMM adds one.
struct ProjectionOf {
  Node* node = nullptr;
  int64_t proj = 0, n = 0;  // which of the node's projections; its columns
  int64_t projections = 1;  // the node's projections
  Value* bias = nullptr;
  std::vector<Value*> bias_inputs;  // the node's biases per projection (FusedGemm)
};

std::optional<ProjectionOf> ProjectionSource(const Value* v) {
  Node* p = v->producer();
  if (!p || p->inputs().size() < 2 || !p->input(0) || !p->input(1) || !p->input(1)->constant() ||
      p->input(0)->dtype() != DType::kF32 || p->input(1)->dtype() != DType::kF32 || p->input(1)->shape().size() != 2 ||
      p->input(0)->shape().size() < 2)
    return std::nullopt;
  if (p->is(op::MatMul)) return ProjectionOf{p, 0, p->input(1)->shape()[1], 1, nullptr, {}};
  if (!p->is(op::FusedGemm)) return std::nullopt;
  std::optional<GemmProjections> form = GemmProjectionsOf(*p);
  if (!form) return std::nullopt;
  for (size_t o = 0; o < p->outputs().size(); ++o)
    if (p->output(o) == v && form->proj_of_output[o] >= 0) {
      const int64_t proj = form->proj_of_output[o];
      return ProjectionOf{p, proj, form->n, form->splits,
                          form->bias_inputs.empty() ? nullptr : form->bias_inputs[static_cast<size_t>(proj)],
                          form->bias_inputs};
    }
  return std::nullopt;
}

// A FusedAttention whose q, k and v come from separate GEMMs of one x (a MatMul and a FusedGemm,
// or three MatMuls): grouped-query attention's q and k / v projections differ in width, so
// FuseGemm keeps them apart. They move into the attention as one projected form: W is their
// weights side by side (each GEMM's columns as they were, in the order the GEMMs come), the
// biases likewise (zeros for a GEMM without), and qkv_split orders the q, k and v blocks. Every
// output of each GEMM must be q, k or v of this attention and read by nothing else. Returns
// whether it formed.
Result<bool> FuseProjectionsApart(Graph& g, Node* a, const FusionOptions& options, FusionReport* report,
                                  std::vector<std::pair<Value*, std::string>>& renames) {
  ProjectionOf src[3];
  std::vector<ProjectionOf> nodes;  // distinct GEMMs, in order of their q / k / v
  for (int t = 0; t < 3; ++t) {
    std::optional<ProjectionOf> p = ProjectionSource(a->input(static_cast<size_t>(t)));
    if (!p || (t > 0 && p->node->input(0) != src[0].node->input(0))) return false;
    src[t] = *p;
    if (std::none_of(nodes.begin(), nodes.end(), [&](const ProjectionOf& q) { return q.node == p->node; }))
      nodes.push_back(*p);
  }
  if (a->input(0) == a->input(1) || a->input(1) == a->input(2) || a->input(0) == a->input(2)) return false;
  for (const ProjectionOf& p : nodes) {
    if (static_cast<int64_t>(p.node->outputs().size()) != p.projections) return false;
    for (const Value* o : p.node->outputs()) {
      const Use* u = match::SingleUse(o);
      if (!u || u->node != a || u->input_index > 2) return false;
    }
  }
  auto refuse = [&](const char* code, const std::string& why) {
    Refuse(report, nodes.front().node, a, code, why);
  };
  for (const ProjectionOf& p : nodes)
    if (options.exclude.count(p.node->name()) || options.exclude.count(a->name())) {
      refuse(refusal::kExcluded, "the q / k / v GEMMs stay apart from the attention: one of them is excluded");
      return false;
    }
  // W's columns: each GEMM's weights in turn; q, k and v's blocks where their projections lie.
  std::vector<int64_t> node_col;
  int64_t cols = 0;
  for (const ProjectionOf& p : nodes) {
    node_col.push_back(cols);
    cols += p.node->input(1)->shape()[1];
  }
  int64_t offset[3];
  for (int t = 0; t < 3; ++t) {
    const size_t i = static_cast<size_t>(
        std::find_if(nodes.begin(), nodes.end(), [&](const ProjectionOf& q) { return q.node == src[t].node; }) -
        nodes.begin());
    offset[t] = node_col[i] + src[t].proj * src[t].n;
  }
  std::vector<int64_t> split(3);
  for (int t = 0; t < 3; ++t) split[t] = (offset[(t + 1) % 3] < offset[t]) + (offset[(t + 2) % 3] < offset[t]);
  AttributeMap attrs = a->attrs();
  attrs["qkv_proj"] = int64_t{1};
  attrs["qkv_split"] = split;
  const bool biased = std::any_of(nodes.begin(), nodes.end(), [](const ProjectionOf& p) { return !p.bias_inputs.empty(); });
  if (biased) attrs["qkv_bias"] = int64_t{1};
  const Result<schemas::Dims> dims = schemas::ReadDims(attrs, a->Describe());
  if (!dims.ok()) {
    refuse(kUnsupportedLayout, StrCat("the q / k / v GEMMs stay apart: ", dims.status().message()));
    return false;
  }
  const Value* x = nodes.front().node->input(0);
  bool widths = cols == dims->proj_cols();
  for (int t = 0; t < 3; ++t) widths &= src[t].n == dims->proj_width(t) && offset[t] == dims->proj_offset(t);
  if (!widths || x->numel() / std::max<int64_t>(x->shape().back(), 1) != dims->b * dims->s) {
    refuse(kUnsupportedLayout,
           StrCat("the q / k / v GEMMs stay apart: the projected form reads B*S = ", dims->b * dims->s,
                  " rows of x and q, k, v of H*d = ", dims->proj_width(0), ", KV*d = ", dims->proj_width(1),
                  " columns (B = ", dims->b, ", H = ", dims->h, ", KV = ", dims->kv_h, "), but x is ", x->TypeString(),
                  " and the projections are ", src[0].n, ", ", src[1].n, ", ", src[2].n, " wide"));
    return false;
  }

  // W and the biases, the GEMMs' side by side.
  const int64_t k = x->shape().back();
  std::vector<const Tensor*> weights;
  std::string how = "side by side at columns";
  for (size_t i = 0; i < nodes.size(); ++i) {
    weights.push_back(nodes[i].node->input(1)->constant().get());
    how += StrCat(" ", node_col[i]);
  }
  GF_ASSIGN_OR_RETURN(auto wt, DeriveTensor(g.prepared_store(), weights, how, [&]() -> Result<Tensor> {
    GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kF32, {k, cols}));
    for (size_t i = 0; i < nodes.size(); ++i) {
      const int64_t ni = nodes[i].node->input(1)->shape()[1];
      const float* src_w = weights[i]->data_as<float>();
      for (int64_t r = 0; r < k; ++r)
        std::copy(src_w + r * ni, src_w + (r + 1) * ni, t.data_as<float>() + r * cols + node_col[i]);
    }
    return t;
  }));
  std::vector<float> bias(biased ? static_cast<size_t>(cols) : 0, 0.f);
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (size_t s = 0; s < nodes[i].bias_inputs.size(); ++s) {
      const float* b = nodes[i].bias_inputs[s]->constant()->data_as<float>();
      std::copy(b, b + nodes[i].n, bias.data() + node_col[i] + static_cast<int64_t>(s) * nodes[i].n);
    }
  }
  const std::string scope = nodes.front().node->name();
  GF_ASSIGN_OR_RETURN(Value * w, g.AddConstant(g.FreshName(scope + "_qkv_weights"), std::move(wt)));
  std::vector<Value*> inputs = {const_cast<Value*>(x), w};
  if (biased) {
    GF_ASSIGN_OR_RETURN(Tensor bt, Tensor::Empty(DType::kF32, {cols}));
    std::copy(bias.begin(), bias.end(), bt.data_as<float>());
    GF_ASSIGN_OR_RETURN(Value * bv, g.AddConstant(g.FreshName(scope + "_qkv_bias"),
                                                  std::make_shared<const Tensor>(std::move(bt))));
    inputs.push_back(bv);
  }
  const size_t extras = inputs.size();
  for (size_t i = 3; i < a->inputs().size(); ++i) inputs.push_back(a->input(i));

  // The reference: each GEMM on its columns of W (and of the biases), then the attention.
  auto ref = std::make_shared<Graph>(a->name());
  std::vector<Value*> rin;
  for (Value* in : inputs) {
    GF_ASSIGN_OR_RETURN(Value * ri, ref->AddInput(ref->FreshName(in->name()), in->dtype(), in->shape()));
    rin.push_back(ri);
  }
  std::map<const Value*, Value*> rmap;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = *nodes[i].node;
    GF_ASSIGN_OR_RETURN(Value * starts, match::AddIntsConstant(*ref, "starts", {node_col[i]}));
    GF_ASSIGN_OR_RETURN(Value * ends, match::AddIntsConstant(*ref, "ends", {node_col[i] + n.input(1)->shape()[1]}));
    GF_ASSIGN_OR_RETURN(Value * axes, match::AddIntsConstant(*ref, "axes", {1}));
    GF_ASSIGN_OR_RETURN(Node * wslice, ref->AddNode("Slice", {rin[1], starts, ends, axes}, {}, n.name() + "/weights"));
    std::vector<Value*> rn_in = {rin[0], wslice->output()};
    if (!nodes[i].bias_inputs.empty()) {
      GF_ASSIGN_OR_RETURN(std::vector<Value*> b,
                          BiasSlices(*ref, rin[2], n, nodes[i].bias_inputs, node_col[i], nodes[i].n));
      rn_in.insert(rn_in.end(), b.begin(), b.end());
    }
    std::vector<std::string> out_names;
    for (const Value* o : n.outputs()) out_names.push_back(o->name());
    GF_ASSIGN_OR_RETURN(Node * rn, ref->AddNode(n.op(), rn_in, n.attrs(), n.name(), -1, out_names));
    for (size_t o = 0; o < n.outputs().size(); ++o) rmap[n.output(o)] = rn->output(o);
  }
  std::vector<Value*> ra_in = {rmap.at(a->input(0)), rmap.at(a->input(1)), rmap.at(a->input(2))};
  for (size_t i = extras; i < rin.size(); ++i) ra_in.push_back(rin[i]);
  GF_ASSIGN_OR_RETURN(Node * ra, ref->AddNode("FusedAttention", ra_in, a->attrs(), a->name(), -1,
                                             {a->output()->name()}));
  GF_RETURN_IF_ERROR(ref->MarkOutput(ra->output()));

  std::vector<Node*> sources;
  for (const ProjectionOf& p : nodes) sources.push_back(p.node);
  GF_RETURN_IF_ERROR(ReplaceWithProjectedAttention(g, a, inputs, std::move(attrs), std::move(ref), sources, report,
                                                   renames));
  return true;
}

}  // namespace

//
// A FusedAttention whose q, k and v are the three outputs of one FusedGemm (x @ W, split in
// three, no epilogue, constant W) that nothing else reads becomes one FusedAttention in the
// projected form: it reads x and W, and each head's task computes that head's q, k and v
// ([S, 3d]) into its own scratch before RoPE, the scores and P V read them there (attention.cc).
// The QKV tensor never goes to memory nor to the other core's cache: that saves the reads of
// q, k and v, not the work of RoPE and softmax on them. The reference graph is the two nodes it
// replaces, so `run --check-fusion` checks the projected kernel against them and a backend
// without the form (CUDA) runs them instead. A GEMM whose epilogue adds a bias to each
// projection moves in too: the node then also reads the three biases as one [3*H*d] constant
// (qkv_bias) and adds them to each projected row before RoPE and the scores. Grouped-query
// attention's q and k / v come from separate GEMMs (their widths differ): FuseProjectionsApart
// takes those in the same way, W being their weights side by side.
Result<int> FuseAttentionProjections(Graph& g, const FusionOptions& options, FusionReport* report) {
  if (!options.enabled || !options.attention_projection) return 0;
  std::vector<Node*> attentions;
  for (const auto& n : g.nodes())
    if (n->is(op::FusedAttention) && n->GetInt("qkv_proj", 0) == 0) attentions.push_back(n.get());
  int formed = 0;
  std::vector<std::pair<Value*, std::string>> renames;
  for (Node* a : attentions) {
    if (a->inputs().size() < 3 || !a->input(0) || !a->input(1) || !a->input(2)) continue;
    Node* gemm = ProducerOf(a->input(0), op::FusedGemm);
    if (!gemm || a->input(1)->producer() != gemm || a->input(2)->producer() != gemm) {
      GF_ASSIGN_OR_RETURN(bool apart, FuseProjectionsApart(g, a, options, report, renames));
      formed += apart;
      continue;
    }
    const std::optional<QkvGemmForm> form = QkvFormOf(*gemm);
    if (!form || !gemm->input(1)->constant() || gemm->outputs().size() != 3) continue;
    auto refuse = [&](const char* code, const std::string& why) {
      Refuse(report, gemm, a, code, why);
    };
    if (options.exclude.count(gemm->name()) || options.exclude.count(a->name())) {
      refuse(refusal::kExcluded, "the QKV GEMM stays apart from the attention: one of them is excluded");
      continue;
    }
    std::vector<int64_t> split(3, -1);
    bool private_outputs = true;
    for (int i = 0; i < 3 && private_outputs; ++i) {
      const Value* v = a->input(i);
      int o = -1;
      for (int j = 0; j < 3; ++j)
        if (gemm->output(j) == v) o = j;
      private_outputs = o >= 0 && match::HasSingleUse(v);
      if (private_outputs) split[i] = form->proj_of_output[static_cast<size_t>(o)];
    }
    if (!private_outputs) {
      refuse(refusal::kTooManyOutputs, "q, k or v is also read outside the attention (or is a graph output): the "
                                       "QKV GEMM keeps writing them");
      continue;
    }
    // The projected form's attributes; the kernel's own reading of them decides whether it
    // takes this attention (layouts, S = Sk, d = dv, the split).
    AttributeMap attrs = a->attrs();
    attrs["qkv_proj"] = int64_t{1};
    attrs["qkv_split"] = split;
    if (form->bias) attrs["qkv_bias"] = int64_t{1};
    const Result<schemas::Dims> dims = schemas::ReadDims(attrs, a->Describe());
    if (!dims.ok()) {
      refuse(kUnsupportedLayout, StrCat("the QKV GEMM stays apart: ", dims.status().message()));
      continue;
    }
    const Value* x = gemm->input(0);
    const Value* w = gemm->input(1);
    if (w->shape().size() != 2 || w->shape()[1] != dims->proj_cols() || x->shape().empty() ||
        x->numel() / std::max<int64_t>(x->shape().back(), 1) != dims->b * dims->s) {
      refuse(kUnsupportedLayout,
             StrCat("the QKV GEMM stays apart: the projected form reads B*S = ", dims->b * dims->s,
                    " rows of x and W [K, 3*H*d = ", 3 * dims->h * dims->d, "] (B = ", dims->b, ", H = ", dims->h,
                    "), but x is ", x->TypeString(), " and W ", w->TypeString(),
                    ": the heads are not the column blocks of one row of x"));
      continue;
    }

    // The reference: the two nodes, reading the new node's inputs one to one.
    std::vector<Value*> inputs = {gemm->input(0), gemm->input(1)};
    if (form->bias) {
      GF_ASSIGN_OR_RETURN(Value * bias, g.AddConstant(g.FreshName(gemm->name() + "_qkv_bias"), form->bias));
      inputs.push_back(bias);
    }
    const size_t extras = inputs.size();  // where the attention's mask / RoPE inputs start
    for (size_t i = 3; i < a->inputs().size(); ++i) inputs.push_back(a->input(i));
    auto ref = std::make_shared<Graph>(a->name());
    std::vector<Value*> rin;
    for (size_t i = 0; i < inputs.size(); ++i) {
      GF_ASSIGN_OR_RETURN(Value * ri, ref->AddInput(ref->FreshName(inputs[i]->name()), inputs[i]->dtype(),
                                                    inputs[i]->shape()));
      rin.push_back(ri);
    }
    std::vector<std::string> gemm_out_names;
    for (const Value* o : gemm->outputs()) gemm_out_names.push_back(o->name());
    std::vector<Value*> rg_in = {rin[0], rin[1]};
    if (form->bias) {  // the GEMM's own bias inputs: its thirds of the one the node reads
      GF_ASSIGN_OR_RETURN(rg_in, BiasSlices(*ref, rin[2], *gemm, form->bias_inputs, 0, rin[2]->shape()[0] / 3));
      rg_in.insert(rg_in.begin(), {rin[0], rin[1]});
    }
    GF_ASSIGN_OR_RETURN(Node * rg, ref->AddNode("FusedGemm", rg_in, gemm->attrs(), gemm->name(), -1,
                                               gemm_out_names));
    std::vector<Value*> ra_in;
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j)
        if (gemm->output(j) == a->input(i)) ra_in.push_back(rg->output(j));
    for (size_t i = extras; i < rin.size(); ++i) ra_in.push_back(rin[i]);
    GF_ASSIGN_OR_RETURN(Node * ra, ref->AddNode("FusedAttention", ra_in, a->attrs(), a->name(), -1,
                                               {a->output()->name()}));
    GF_RETURN_IF_ERROR(ref->MarkOutput(ra->output()));

    GF_RETURN_IF_ERROR(ReplaceWithProjectedAttention(g, a, inputs, std::move(attrs), std::move(ref), {gemm}, report,
                                                     renames));
    ++formed;
  }
  if (formed == 0) return 0;
  GF_RETURN_IF_ERROR(g.TopologicalSort());
  for (auto& [v, n] : renames) GF_RETURN_IF_ERROR(g.RenameValue(v, n));
  return formed;
}

}  // namespace graphfuse
