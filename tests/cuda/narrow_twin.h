// Test helpers for the CUDA row kernels in f16 and bf16: a node of a (pipelined, f32) graph
// rebuilt over another float dtype, alone in a graph of its own.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graphfuse/graph.h"
#include "graphfuse/tensor.h"

namespace graphfuse::cuda {

// `t` with every element converted to `dt` (round to nearest even for f16 / bf16).
inline Tensor ConvertedTo(const Tensor& t, DType dt) {
  Tensor out = Tensor::Empty(dt, t.shape()).value();
  for (int64_t i = 0; i < t.numel(); ++i) out.SetFromDouble(i, t.GetAsDouble(i));
  return out;
}

// `g` with its float inputs and constants of dtype `dt`, every node added again so that
// inference types its outputs.
inline Result<std::shared_ptr<const Graph>> RetypedGraph(const Graph& g, DType dt) {
  auto out = std::make_shared<Graph>(g.name());
  std::map<const Value*, Value*> map;
  for (const Value* in : g.inputs()) {
    GF_ASSIGN_OR_RETURN(map[in], out->AddInput(in->name(), IsFloat(in->dtype()) ? dt : in->dtype(), in->shape()));
  }
  for (const Value* c : g.constants()) {
    const Tensor& t = *c->constant();
    auto conv = std::make_shared<Tensor>(IsFloat(t.dtype()) ? ConvertedTo(t, dt) : ConvertedTo(t, t.dtype()));
    GF_ASSIGN_OR_RETURN(map[c], out->AddConstant(c->name(), conv));
  }
  for (const auto& n : g.nodes()) {
    std::vector<Value*> ins;
    for (const Value* v : n->inputs()) ins.push_back(v ? map.at(v) : nullptr);
    GF_ASSIGN_OR_RETURN(Node * m, out->AddNode(n->op(), ins, n->attrs(), n->name(), static_cast<int>(n->outputs().size())));
    for (size_t k = 0; k < n->outputs().size(); ++k) map[n->output(k)] = m->output(k);
  }
  for (const Value* o : g.outputs()) GF_RETURN_IF_ERROR(out->MarkOutput(map.at(o)));
  return std::shared_ptr<const Graph>(std::move(out));
}

struct NodeTwin {
  std::unique_ptr<Graph> graph;  // the node's inputs, the node, its outputs
  const Node* node = nullptr;
};

// `node` over float dtype `dt`: its float inputs, its bodies (FusedNorm / FusedSoftmax) and its
// float outputs of dtype dt (LayerNormalization's statistics stay f32, as inference says); the
// "reference" graph is dropped. Inference types the node where it accepts dt; FusedNorm,
// FusedSoftmax and FusedAttention take f32 rows only there (their CPU kernels), so their
// twins are typed here: every float output `out_dt` (dt unless given).
inline Result<NodeTwin> NarrowTwin(const Node& node, DType dt, std::optional<DType> out_dt = std::nullopt) {
  NodeTwin t;
  t.graph = std::make_unique<Graph>(node.name() + "_" + DTypeName(dt));
  std::vector<Value*> ins;
  for (const Value* v : node.inputs()) {
    if (!v) return InvalidArgument("NarrowTwin: an omitted input");
    GF_ASSIGN_OR_RETURN(Value * in, t.graph->AddInput(v->name(), IsFloat(v->dtype()) ? dt : v->dtype(), v->shape()));
    ins.push_back(in);
  }
  AttributeMap attrs;
  for (const auto& [key, value] : node.attrs()) {
    if (key == "reference") continue;
    const auto* body = std::get_if<std::shared_ptr<const Graph>>(&value);
    if (!body) {
      attrs[key] = value;
      continue;
    }
    GF_ASSIGN_OR_RETURN(attrs[key], RetypedGraph(**body, dt));
  }
  const int nout = static_cast<int>(node.outputs().size());
  Result<Node*> inferred = InvalidArgument("the output dtype is given");
  if (!out_dt) inferred = t.graph->AddNode(node.op(), ins, attrs, node.name(), nout);
  if (inferred.ok()) {
    t.node = *inferred;
  } else {
    std::vector<ValueType> types;
    for (const Value* o : node.outputs()) types.push_back({IsFloat(o->dtype()) ? out_dt.value_or(dt) : o->dtype(), o->shape()});
    t.node = t.graph->AddNodeTyped(node.op(), ins, attrs, types, node.name());
  }
  for (size_t k = 0; k < t.node->outputs().size(); ++k) GF_RETURN_IF_ERROR(t.graph->MarkOutput(t.node->output(k)));
  return t;
}

}  // namespace graphfuse::cuda
