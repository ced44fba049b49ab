// The graph IR: values with a dtype and a static shape, nodes with attributes, and the graph
// that owns them in topological order. Fusion rewrites this IR, so producer/consumer walks
// are O(1) (every value knows its producer and its uses) and rewriting is explicit.
//
//   graph @mlp(%x: f32[4,16], %w: f32[16,16] = const) -> (%2) {
//     %0 = MatMul(%x, %w)
//     %1 = Gelu(%0)
//     %2 = Add(%1, %x)
//   }
#pragma once

#include <list>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "graphfuse/dtype.h"
#include "graphfuse/op_id.h"
#include "graphfuse/shape.h"
#include "graphfuse/status.h"
#include "graphfuse/tensor.h"

namespace graphfuse {

class Node;
class Graph;
class PreparedStore;

// An attribute value: int, float, string, ints, floats, a tensor, or a graph (the body of a
// fused group).
using Attribute = std::variant<int64_t, float, std::string, std::vector<int64_t>, std::vector<float>,
                               std::shared_ptr<const Tensor>, std::shared_ptr<const Graph>>;
using AttributeMap = std::map<std::string, Attribute>;

// Typed attribute lookups with a default (a float attribute also reads an int one).
int64_t AttrInt(const AttributeMap& m, const std::string& k, int64_t def);
float AttrFloat(const AttributeMap& m, const std::string& k, float def);
std::string AttrString(const AttributeMap& m, const std::string& k, const std::string& def);
std::vector<int64_t> AttrInts(const AttributeMap& m, const std::string& k, const std::vector<int64_t>& def);

struct Use {
  Node* node;
  int input_index;
};

class Value {
 public:
  const std::string& name() const { return name_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  // The node that computes it; nullptr for graph inputs and constants.
  Node* producer() const { return producer_; }
  int producer_output() const { return producer_output_; }
  const std::vector<Use>& uses() const { return uses_; }
  // Constant data (initializers, folded subgraphs); nullptr otherwise.
  const std::shared_ptr<const Tensor>& constant() const { return constant_; }
  bool is_graph_input() const { return is_graph_input_; }
  bool is_graph_output() const { return is_graph_output_; }
  int64_t numel() const;
  std::string TypeString() const;  // "f32[4,16]"

 private:
  friend class Graph;
  std::string name_;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Node* producer_ = nullptr;
  int producer_output_ = 0;
  std::vector<Use> uses_;
  std::shared_ptr<const Tensor> constant_;
  bool is_graph_input_ = false;
  bool is_graph_output_ = false;
  std::list<std::unique_ptr<Value>>::iterator self_;  // its place in the graph's list (O(1) removal)
};

class Node {
 public:
  const std::string& name() const { return name_; }
  const std::string& op() const { return op_; }
  // Its op's typed identity (graphfuse/op_id.h): passes ask n.is(op::MatMul).
  op::Id op_id() const { return op_id_; }
  bool is(op::Id id) const { return op_id_ == id; }
  // Inputs in order; nullptr marks an omitted optional input.
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  Value* input(size_t i) const { return i < inputs_.size() ? inputs_[i] : nullptr; }
  Value* output(size_t i = 0) const { return outputs_[i]; }
  const AttributeMap& attrs() const { return attrs_; }
  bool has_attr(const std::string& k) const { return attrs_.count(k) != 0; }
  // Typed attribute lookups with a default.
  int64_t GetInt(const std::string& k, int64_t def) const { return AttrInt(attrs_, k, def); }
  float GetFloat(const std::string& k, float def) const { return AttrFloat(attrs_, k, def); }
  std::string GetString(const std::string& k, const std::string& def) const { return AttrString(attrs_, k, def); }
  std::vector<int64_t> GetInts(const std::string& k, const std::vector<int64_t>& def = {}) const {
    return AttrInts(attrs_, k, def);
  }
  // "node 'n3' (Add)" for error messages.
  std::string Describe() const;
  // The graph attribute `k` (a fused group's body), or nullptr.
  const Graph* GetGraph(const std::string& k) const;

 private:
  friend class Graph;
  std::string name_;
  std::string op_;
  op::Id op_id_ = op::kUnknown;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  AttributeMap attrs_;
  std::list<std::unique_ptr<Node>>::iterator self_;  // its place in the graph's list (O(1) removal)
};

// A value's type as the builder needs it before it exists.
struct ValueType {
  DType dtype;
  Shape shape;
};

class Graph {
 public:
  explicit Graph(std::string name = "main") : name_(std::move(name)) {}
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  const std::string& name() const { return name_; }

  // ---- building ----
  Result<Value*> AddInput(const std::string& name, DType dtype, const Shape& shape);
  Result<Value*> AddConstant(const std::string& name, std::shared_ptr<const Tensor> data);
  // Appends a node; its output types come from the op registry's shape/type inference,
  // and the error names the node, op, input types and reason when inference fails.
  Result<Node*> AddNode(const std::string& op, const std::vector<Value*>& inputs, AttributeMap attrs = {},
                        const std::string& name = "", int num_outputs = -1, const std::vector<std::string>& output_names = {});
  Result<Node*> AddNode(op::Id op, const std::vector<Value*>& inputs, AttributeMap attrs = {},
                        const std::string& name = "", int num_outputs = -1,
                        const std::vector<std::string>& output_names = {}) {
    return AddNode(std::string(op::Name(op)), inputs, std::move(attrs), name, num_outputs, output_names);
  }
  // Appends a node whose output types are given (used by rewrites that know them).
  Node* AddNodeTyped(const std::string& op, const std::vector<Value*>& inputs, AttributeMap attrs,
                     const std::vector<ValueType>& output_types, const std::string& name = "",
                     const std::vector<std::string>& output_names = {});
  Node* AddNodeTyped(op::Id op, const std::vector<Value*>& inputs, AttributeMap attrs,
                     const std::vector<ValueType>& output_types, const std::string& name = "",
                     const std::vector<std::string>& output_names = {}) {
    return AddNodeTyped(std::string(op::Name(op)), inputs, std::move(attrs), output_types, name, output_names);
  }
  Status MarkOutput(Value* v);

  // ---- rewriting ----
  // Every use of `from` (and graph-output status) moves to `to`.
  void ReplaceAllUsesWith(Value* from, Value* to);
  // Removes a node whose outputs have no uses and are not graph outputs.
  void RemoveNode(Node* n);
  // Removes nodes whose outputs are unused (and constants nobody reads); returns how many.
  int RemoveDeadNodes();
  // Reorders the nodes topologically, keeping the current order where it is already valid
  // (rewrites append nodes at the end). An error if the graph has a cycle.
  Status TopologicalSort();
  // Renames a value (the name must be free; rewrites use it to keep user-visible names).
  Status RenameValue(Value* v, const std::string& name);
  // Turns value `v` into a constant holding `data` and removes its producer if now dead.
  void ReplaceWithConstant(Value* v, std::shared_ptr<const Tensor> data);

  // ---- reading ----
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  const std::list<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  std::vector<Value*> constants() const;
  Value* FindValue(const std::string& name) const;
  size_t num_nodes() const { return nodes_.size(); }

  // Checks the invariants: every input defined before use (topological order), single
  // definition, use lists consistent, types equal to what inference gives, outputs defined.
  Status Verify() const;

  // A unique name with the given prefix ("t" -> "t_12").
  std::string FreshName(const std::string& prefix);

  // ---- what the graph's weights derive ----
  // The store of the model the graph was instantiated from (nullptr for a graph built alone):
  // passes and kernels that derive from constant weights (concatenated projections, packed
  // panels) make each derivation once there, shared by every plan of the model.
  PreparedStore* prepared_store() const { return store_.get(); }
  const std::shared_ptr<PreparedStore>& prepared_store_shared() const { return store_; }
  void set_prepared_store(std::shared_ptr<PreparedStore> store) { store_ = std::move(store); }

 private:
  Value* NewValue(const std::string& name, DType dtype, const Shape& shape);
  std::string name_;
  std::list<std::unique_ptr<Value>> values_;
  std::list<std::unique_ptr<Node>> nodes_;
  std::map<std::string, Value*> by_name_;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  int64_t fresh_ = 0;
  std::shared_ptr<PreparedStore> store_;
};

}  // namespace graphfuse
