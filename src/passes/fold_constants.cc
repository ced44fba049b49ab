#include "fold_constants.h"

#include <cstring>
#include <vector>

#include "../ir/op_registry.h"

namespace graphfuse {

Result<bool> FoldNodeIfConstant(Graph& g, Node* n, const FoldOptions& options) {
  const OpSchema* s = FindSchema(n->op());
  if (!s) return false;
  if (!options.target) return InvalidArgument("constant folding needs a Target to evaluate ", n->Describe());
  // Shape and Size read only the (static) shape of their input: their kernels run on a view
  // without data.
  if (n->op() != "Shape" && n->op() != "Size")
    for (const Value* in : n->inputs())
      if (in != nullptr && in->constant() == nullptr) return false;
  int64_t bytes = 0;
  for (const Value* o : n->outputs()) bytes += o->numel() * static_cast<int64_t>(DTypeSize(o->dtype()));
  if (bytes > options.max_output_bytes) return false;
  std::vector<TensorView> in;
  for (const Value* v : n->inputs())
    in.push_back(v ? (v->constant() ? v->constant()->view() : TensorView{v->dtype(), v->shape(), nullptr})
                   : TensorView{DType::kF32, {}, nullptr});
  std::vector<std::shared_ptr<Tensor>> outs;
  std::vector<TensorView> out_views;
  for (const Value* o : n->outputs()) {
    GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(o->dtype(), o->shape()));
    outs.push_back(std::make_shared<Tensor>(std::move(t)));
    out_views.push_back(outs.back()->view());
  }
  if (s->view) {
    // A view's result is its input's bytes under the output's shape.
    if (!n->input(0) || !n->input(0)->constant()) return false;
    std::memcpy(outs[0]->data(), n->input(0)->constant()->data(), outs[0]->nbytes());
  } else {
    GF_RETURN_IF_ERROR(options.target->EvaluateOnHost(*n, in, out_views).WithContext("constant folding"));
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
