#include "graphfuse/graph.h"

#include <algorithm>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "ir/op_registry.h"

namespace graphfuse {

int64_t Value::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

std::string Value::TypeString() const { return StrCat(DTypeName(dtype_), ShapeToString(shape_)); }

namespace {
template <class T>
const T* GetAttr(const AttributeMap& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? nullptr : std::get_if<T>(&it->second);
}
}  // namespace

int64_t AttrInt(const AttributeMap& m, const std::string& k, int64_t def) {
  const int64_t* v = GetAttr<int64_t>(m, k);
  return v ? *v : def;
}
float AttrFloat(const AttributeMap& m, const std::string& k, float def) {
  if (const float* v = GetAttr<float>(m, k)) return *v;
  if (const int64_t* i = GetAttr<int64_t>(m, k)) return static_cast<float>(*i);
  return def;
}
std::string AttrString(const AttributeMap& m, const std::string& k, const std::string& def) {
  const std::string* v = GetAttr<std::string>(m, k);
  return v ? *v : def;
}
std::vector<int64_t> AttrInts(const AttributeMap& m, const std::string& k, const std::vector<int64_t>& def) {
  const auto* v = GetAttr<std::vector<int64_t>>(m, k);
  return v ? *v : def;
}

const Graph* Node::GetGraph(const std::string& k) const {
  const auto* v = GetAttr<std::shared_ptr<const Graph>>(attrs_, k);
  return v ? v->get() : nullptr;
}

std::string Node::Describe() const { return StrCat("node '", name_, "' (", op_, ")"); }

Value* Graph::NewValue(const std::string& name, DType dtype, const Shape& shape) {
  auto v = std::make_unique<Value>();
  v->name_ = name.empty() ? FreshName("v") : name;
  v->dtype_ = dtype;
  v->shape_ = shape;
  Value* raw = v.get();
  values_.push_back(std::move(v));
  raw->self_ = std::prev(values_.end());
  by_name_[raw->name_] = raw;
  return raw;
}

std::string Graph::FreshName(const std::string& prefix) {
  for (;;) {
    std::string n = StrCat(prefix, "_", fresh_++);
    if (!by_name_.count(n)) return n;
  }
}

Result<Value*> Graph::AddInput(const std::string& name, DType dtype, const Shape& shape) {
  if (by_name_.count(name)) return InvalidArgument("graph input '", name, "' is defined twice");
  GF_RETURN_IF_ERROR(NumElements(shape).status().WithContext(StrCat("graph input '", name, "'")));
  Value* v = NewValue(name, dtype, shape);
  v->is_graph_input_ = true;
  inputs_.push_back(v);
  return v;
}

Result<Value*> Graph::AddConstant(const std::string& name, std::shared_ptr<const Tensor> data) {
  if (!name.empty() && by_name_.count(name)) return InvalidArgument("constant '", name, "' is defined twice");
  if (!data) return InvalidArgument("constant '", name, "' has no data");
  Value* v = NewValue(name, data->dtype(), data->shape());
  v->constant_ = std::move(data);
  return v;
}

Result<Node*> Graph::AddNode(const std::string& op, const std::vector<Value*>& inputs, AttributeMap attrs,
                             const std::string& name, int num_outputs, const std::vector<std::string>& output_names) {
  const std::string node_name = name.empty() ? FreshName(op) : name;
  const OpSchema* schema = FindSchema(op);
  if (!schema) return Unimplemented("node '", node_name, "' (", op, "): op not supported");
  const int n_in = static_cast<int>(inputs.size());
  if (n_in < schema->min_inputs || n_in > schema->max_inputs)
    return InvalidArgument("node '", node_name, "' (", op, ") takes ", schema->min_inputs,
                           schema->max_inputs != schema->min_inputs ? StrCat(" to ", schema->max_inputs) : "",
                           " inputs, got ", n_in);
  for (int i = 0; i < n_in; ++i)
    if (inputs[i] == nullptr && i < schema->min_inputs)
      return InvalidArgument("node '", node_name, "' (", op, "): required input ", i, " is missing");
  InferContext ictx{op, inputs, attrs};
  auto types = schema->infer(ictx);
  if (!types.ok()) return types.status().WithContext(StrCat("node '", node_name, "'"));
  std::vector<ValueType> out = std::move(*types);
  if (num_outputs >= 0) {
    if (num_outputs > static_cast<int>(out.size()))
      return InvalidArgument("node '", node_name, "' (", op, ") has ", out.size(), " outputs, asked for ", num_outputs);
    out.resize(num_outputs);
  }
  for (size_t i = 0; i < output_names.size(); ++i) {
    const std::string& o = output_names[i];
    const bool repeated = std::find(output_names.begin(), output_names.begin() + i, o) != output_names.begin() + i;
    if (!o.empty() && (by_name_.count(o) || repeated))
      return InvalidArgument("node '", node_name, "' (", op, "): value '", o, "' is defined twice");
  }
  return AddNodeTyped(op, inputs, std::move(attrs), out, node_name, output_names);
}

Node* Graph::AddNodeTyped(const std::string& op, const std::vector<Value*>& inputs, AttributeMap attrs,
                          const std::vector<ValueType>& output_types, const std::string& name,
                          const std::vector<std::string>& output_names) {
  auto n = std::make_unique<Node>();
  n->name_ = name.empty() ? FreshName(op) : name;
  n->op_ = op;
  n->op_id_ = op::FromName(op);
  n->attrs_ = std::move(attrs);
  n->inputs_ = inputs;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i]) inputs[i]->uses_.push_back({n.get(), static_cast<int>(i)});
  for (size_t i = 0; i < output_types.size(); ++i) {
    const std::string oname = i < output_names.size() && !output_names[i].empty() ? output_names[i]
                                                                                  : FreshName(n->name_);
    Value* v = NewValue(oname, output_types[i].dtype, output_types[i].shape);
    v->producer_ = n.get();
    v->producer_output_ = static_cast<int>(i);
    n->outputs_.push_back(v);
  }
  Node* raw = n.get();
  nodes_.push_back(std::move(n));
  raw->self_ = std::prev(nodes_.end());
  return raw;
}

Status Graph::MarkOutput(Value* v) {
  if (!v) return InvalidArgument("graph output is null");
  if (std::find(outputs_.begin(), outputs_.end(), v) == outputs_.end()) outputs_.push_back(v);
  v->is_graph_output_ = true;
  return Status::Ok();
}

void Graph::ReplaceAllUsesWith(Value* from, Value* to) {
  if (from == to) return;
  for (const Use& u : from->uses_) {
    u.node->inputs_[u.input_index] = to;
    to->uses_.push_back(u);
  }
  from->uses_.clear();
  for (Value*& o : outputs_)
    if (o == from) {
      o = to;
      to->is_graph_output_ = true;
    }
  from->is_graph_output_ = false;
}

void Graph::RemoveNode(Node* n) {
  for (Value* o : n->outputs_) GF_CHECK(o->uses_.empty() && !o->is_graph_output_, "removing ", n->Describe(), " whose output is used");
  for (size_t i = 0; i < n->inputs_.size(); ++i) {
    Value* in = n->inputs_[i];
    if (!in) continue;
    auto& uses = in->uses_;
    uses.erase(std::remove_if(uses.begin(), uses.end(),
                              [&](const Use& u) { return u.node == n && u.input_index == static_cast<int>(i); }),
               uses.end());
  }
  for (Value* o : n->outputs_) {
    by_name_.erase(o->name_);
    values_.erase(o->self_);
  }
  nodes_.erase(n->self_);
}

int Graph::RemoveDeadNodes() {
  int removed = 0;
  // Last to first, so that in topological order a node's producers are seen after it dies;
  // again while a pass removed anything (rewrites leave nodes out of order until sorted).
  for (bool changed = true; changed;) {
    changed = false;
    for (auto next = nodes_.end(); next != nodes_.begin();) {
      Node* n = std::prev(next)->get();
      bool dead = true;
      for (Value* o : n->outputs_) dead &= o->uses_.empty() && !o->is_graph_output_;
      if (!dead) {
        --next;
        continue;
      }
      RemoveNode(n);  // erases the node before `next`; `next` stays valid
      ++removed;
      changed = true;
    }
  }
  // Constants nobody reads.
  values_.remove_if([&](const std::unique_ptr<Value>& v) {
    const bool dead = v->constant_ && !v->producer_ && v->uses_.empty() && !v->is_graph_output_ && !v->is_graph_input_;
    if (dead) by_name_.erase(v->name_);
    return dead;
  });
  return removed;
}

Status Graph::RenameValue(Value* v, const std::string& name) {
  if (v->name_ == name) return Status::Ok();
  if (by_name_.count(name)) return InvalidArgument("cannot rename '", v->name_, "' to '", name, "': name taken");
  by_name_.erase(v->name_);
  v->name_ = name;
  by_name_[name] = v;
  return Status::Ok();
}

Status Graph::TopologicalSort() {
  std::unordered_map<const Node*, size_t> position;
  std::vector<Node*> order;
  for (const auto& n : nodes_) position[n.get()] = order.size(), order.push_back(n.get());
  // Kahn's algorithm, always taking the ready node that came first.
  std::unordered_map<const Node*, int> pending;
  for (Node* n : order) {
    int k = 0;
    for (const Value* in : n->inputs_)
      if (in && in->producer_) ++k;
    pending[n] = k;
  }
  std::set<std::pair<size_t, Node*>> ready;
  for (Node* n : order)
    if (pending[n] == 0) ready.insert({position[n], n});
  std::vector<Node*> sorted;
  while (!ready.empty()) {
    Node* n = ready.begin()->second;
    ready.erase(ready.begin());
    sorted.push_back(n);
    for (const Value* o : n->outputs_)
      for (const Use& u : o->uses_)
        if (--pending[u.node] == 0) ready.insert({position[u.node], u.node});
  }
  if (sorted.size() != order.size()) return Internal("graph '", name_, "' has a cycle");
  std::unordered_map<const Node*, std::unique_ptr<Node>> owned;
  for (auto& n : nodes_) owned[n.get()] = std::move(n);
  nodes_.clear();
  for (Node* n : sorted) {
    nodes_.push_back(std::move(owned[n]));
    n->self_ = std::prev(nodes_.end());
  }
  return Status::Ok();
}

void Graph::ReplaceWithConstant(Value* v, std::shared_ptr<const Tensor> data) {
  Node* producer = v->producer_;
  if (producer) {
    // Detach v from its producer: the producer keeps a fresh placeholder output.
    auto placeholder = std::make_unique<Value>();
    placeholder->name_ = FreshName(v->name_ + "_dead");
    placeholder->dtype_ = v->dtype_;
    placeholder->shape_ = v->shape_;
    placeholder->producer_ = producer;
    placeholder->producer_output_ = v->producer_output_;
    producer->outputs_[v->producer_output_] = placeholder.get();
    by_name_[placeholder->name_] = placeholder.get();
    values_.push_back(std::move(placeholder));
    values_.back()->self_ = std::prev(values_.end());
  }
  v->producer_ = nullptr;
  v->producer_output_ = 0;
  v->constant_ = std::move(data);
}

std::vector<Value*> Graph::constants() const {
  std::vector<Value*> out;
  for (const auto& v : values_)
    if (v->constant_) out.push_back(v.get());
  return out;
}

Value* Graph::FindValue(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

Status Graph::Verify() const {
  std::unordered_set<const Value*> defined;
  defined.reserve(values_.size() + inputs_.size());
  for (const Value* in : inputs_) defined.insert(in);
  for (const auto& v : values_)
    if (v->constant_) {
      if (v->constant_->dtype() != v->dtype_ || v->constant_->shape() != v->shape_)
        return Internal("constant '", v->name_, "' is ", v->TypeString(), " but holds ",
                        DTypeName(v->constant_->dtype()), ShapeToString(v->constant_->shape()));
      defined.insert(v.get());
    }
  for (const auto& n : nodes_) {
    for (size_t i = 0; i < n->inputs_.size(); ++i) {
      const Value* in = n->inputs_[i];
      if (!in) continue;
      if (!defined.count(in))
        return Internal(n->Describe(), ": input ", i, " '", in->name_, "' is used before it is defined (or never)");
      bool listed = false;
      for (const Use& u : in->uses_) listed |= u.node == n.get() && u.input_index == static_cast<int>(i);
      if (!listed) return Internal(n->Describe(), ": input '", in->name_, "' does not list this use");
    }
    const OpSchema* schema = FindSchema(n->op_);
    if (!schema) return Internal(n->Describe(), ": op not in the registry");
    InferContext ictx{n->op_, n->inputs_, n->attrs_};
    auto types = schema->infer(ictx);
    if (!types.ok()) return types.status().WithContext(n->Describe());
    for (size_t i = 0; i < n->outputs_.size(); ++i) {
      const Value* o = n->outputs_[i];
      if (o->producer_ != n.get() || o->producer_output_ != static_cast<int>(i))
        return Internal(n->Describe(), ": output ", i, " does not name this node as producer");
      if (defined.count(o)) return Internal("value '", o->name_, "' is defined twice");
      if (i < types->size() && ((*types)[i].dtype != o->dtype_ || (*types)[i].shape != o->shape_))
        return Internal(n->Describe(), ": output '", o->name_, "' is ", o->TypeString(), " but inference gives ",
                        DTypeName((*types)[i].dtype), ShapeToString((*types)[i].shape));
      defined.insert(o);
    }
  }
  for (const Value* o : outputs_)
    if (!defined.count(o)) return Internal("graph output '", o->name_, "' is never defined");
  return Status::Ok();
}

}  // namespace graphfuse
