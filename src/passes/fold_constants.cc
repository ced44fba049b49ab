#include "passes/fold_constants.h"

#include <cstring>
#include <vector>

#include "core/prepared_store.h"
#include "ir/op_registry.h"

namespace graphfuse {

namespace {

// The key of a fold in the model's store: the op, its attributes and output types; empty when
// an attribute holds a graph or a tensor (such nodes are folded per plan).
std::string FoldKey(const Node& n) {
  std::string key = "fold " + n.op();
  for (const auto& [name, a] : n.attrs()) {
    key.append(" ").append(name).append("=");
    if (const auto* i = std::get_if<int64_t>(&a)) key += std::to_string(*i);
    else if (const auto* f = std::get_if<float>(&a)) key += PreparedStore::Exact(*f);
    else if (const auto* str = std::get_if<std::string>(&a)) key.append("'").append(*str).append("'");
    else if (const auto* is = std::get_if<std::vector<int64_t>>(&a)) key += ShapeToString(*is);
    else if (const auto* fs = std::get_if<std::vector<float>>(&a))
      for (float f : *fs) key.append(PreparedStore::Exact(f)).append(",");
    else return "";
  }
  for (const Value* o : n.outputs()) key.append(" -> ").append(o->TypeString());
  return key;
}

// Runs the node on its constant inputs into new tensors.
Result<std::vector<std::shared_ptr<Tensor>>> Evaluate(const Node& n, const OpSchema& s, const FoldOptions& options) {
  std::vector<TensorView> in;
  for (const Value* v : n.inputs())
    in.push_back(v ? (v->constant() ? v->constant()->view() : TensorView{v->dtype(), v->shape(), nullptr})
                   : TensorView{});
  std::vector<std::shared_ptr<Tensor>> outs;
  std::vector<TensorView> out_views;
  for (const Value* o : n.outputs()) {
    GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(o->dtype(), o->shape()));
    outs.push_back(std::make_shared<Tensor>(std::move(t)));
    out_views.push_back(outs.back()->view());
  }
  if (s.view) {
    // A view's result is its input's bytes under the output's shape.
    std::memcpy(outs[0]->data(), n.input(0)->constant()->data(), outs[0]->nbytes());
  } else {
    GF_RETURN_IF_ERROR(options.target->EvaluateOnHost(n, in, out_views).WithContext("constant folding"));
  }
  return outs;
}

}  // namespace

Result<bool> FoldNodeIfConstant(Graph& g, Node* n, const FoldOptions& options) {
  const OpSchema* s = FindSchema(n->op());
  if (!s) return false;
  if (!options.target) return InvalidArgument("constant folding needs a Target to evaluate ", n->Describe());
  // Shape and Size read only the (static) shape of their input: their kernels run on a view
  // without data.
  if (!n->is(op::Shape) && !n->is(op::Size))
    for (const Value* in : n->inputs())
      if (in != nullptr && in->constant() == nullptr) return false;
  if (s->view && (!n->input(0) || !n->input(0)->constant())) return false;
  int64_t bytes = 0;
  for (const Value* o : n->outputs()) bytes += o->numel() * static_cast<int64_t>(DTypeSize(o->dtype()));
  if (bytes > options.max_output_bytes) return false;
  // A fold of the model's weights (a transposed or reshaped weight) is made once, in the store.
  PreparedStore* store = g.prepared_store();
  std::string key = store ? FoldKey(*n) : "";
  if (!key.empty()) {
    std::vector<const Tensor*> sources;
    for (const Value* in : n->inputs()) {
      if (in && !in->constant()) {  // Shape / Size of a value without data: folded per plan
        key.clear();
        break;
      }
      sources.push_back(in ? in->constant().get() : nullptr);
    }
    if (!key.empty()) key = store->KeyOf(key, sources);
  }
  std::vector<std::shared_ptr<const Tensor>> outs;
  if (!key.empty()) {
    // Each output is an entry of its own (a tensor later folds key on); the first one made
    // makes them all.
    std::vector<std::shared_ptr<Tensor>> made;
    for (size_t k = 0; k < n->outputs().size(); ++k) {
      GF_ASSIGN_OR_RETURN(auto t, store->GetOrMakeTensor(StrCat(key, " #", k), [&]() -> Result<Tensor> {
                            if (made.empty()) {
                              GF_ASSIGN_OR_RETURN(made, Evaluate(*n, *s, options));
                            }
                            return std::move(*made[k]);
                          }));
      outs.push_back(std::move(t));
    }
  } else {
    GF_ASSIGN_OR_RETURN(auto made, Evaluate(*n, *s, options));
    outs.assign(made.begin(), made.end());
  }
  for (size_t k = 0; k < outs.size(); ++k) g.ReplaceWithConstant(n->output(k), outs[k]);
  return true;
}

Result<int> FoldConstants(Graph& g, const FoldOptions& options) {
  int folded = 0;
  std::vector<Node*> order;
  for (const auto& n : g.nodes()) order.push_back(n.get());
  for (Node* n : order) {
    GF_ASSIGN_OR_RETURN(bool did, FoldNodeIfConstant(g, n, options));
    folded += did ? 1 : 0;
  }
  g.RemoveDeadNodes();
  return folded;
}

}  // namespace graphfuse
