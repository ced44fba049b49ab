// Pattern-matching helpers shared by the rewrite passes: from a value to its producer or its
// one reader, constants read as scalars or as their data, the operands of a commutative op
// named by role, and the axis and broadcast questions every matcher asks.
//
//   // x when v = Mul(x, 0.5) or Mul(0.5, x), and v's producer is read by nothing else
//   Node* mul = match::SingleUseProducer(v, op::Mul);
//   Value* x = mul ? match::OperandBesideScalar(*mul, 0.5) : nullptr;
//
// Every helper is a query: none changes the graph. A Value argument may be nullptr (an omitted
// optional input), which matches nothing; a Node argument is a node that exists.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "graphfuse/graph.h"

namespace graphfuse::match {

// ---- producers and readers ----

// v's producer if it is an `op` node; nullptr for another op, a graph input or a constant.
Node* ProducerOf(const Value* v, op::Id op);

// Whether v is read by exactly one node input and is not a graph output: a pattern that takes
// v's reader may take v's producer too, since nothing else sees v.
bool HasSingleUse(const Value* v);

// v's one use (reader and input index) when HasSingleUse(v), else nullptr.
const Use* SingleUse(const Value* v);

// ProducerOf(v, op) when also HasSingleUse(v): a producer the pattern may absorb.
Node* SingleUseProducer(const Value* v, op::Id op);

// Whether v is a graph output or is read by a node other than `reader`.
bool IsUsedOutside(const Value* v, const Node* reader);
// Whether v is a graph output or is read by a node not in `nodes`.
bool IsUsedOutside(const Value* v, const std::set<const Node*>& nodes);

// The nodes reachable from the outputs of `from` along uses, not entering the nodes in `stop`
// (nor counting them). A node of `from` is in the result only if another one reaches it.
std::set<const Node*> ReachableFrom(const std::vector<const Node*>& from, const std::set<const Node*>& stop = {});

// An op that only gives its input another shape (same elements, same order, no kernel):
// Reshape, Flatten, Squeeze, Unsqueeze, Identity.
inline bool IsReshapeLike(const Node& n) {
  return n.is(op::Reshape) || n.is(op::Flatten) || n.is(op::Squeeze) || n.is(op::Unsqueeze) || n.is(op::Identity);
}

// Whether n is an op of the elementwise op table (not a FusedElementwise group).
bool IsElementwiseOp(const Node& n);

// ---- constants ----

// Which one-element constants a matcher reads as a scalar.
struct ScalarRule {
  // Integer constants count too (an exporter may write Pow's exponent 2 as one); otherwise
  // only f32 / f16 / bf16. Bool never counts.
  bool integers = false;
  // The most dims the constant may have: 1 accepts [] and [1]; -1 any shape of one element
  // ([1,1,1,1] too).
  int max_rank = -1;
};

// The value of v if it is a graph constant of one element that `rule` accepts.
std::optional<double> ScalarConstant(const Value* v, ScalarRule rule = {});

// Whether v is a scalar constant (per `rule`) equal to `c`, compared in f32 with relative
// tolerance kScalarRelTol: 0.5001 is not 0.5, an exporter's rounding of 1/sqrt(2) is. An f16 /
// bf16 constant also matches when it is c rounded to its dtype.
inline constexpr float kScalarRelTol = 1e-6f;
bool IsScalarConstant(const Value* v, double c, ScalarRule rule = {});

// The elements of an i64 or i32 constant (Slice bounds, Reduce axes), read exactly.
std::optional<std::vector<int64_t>> IntConstant(const Value* v);

// The elements of an f32 constant.
std::optional<std::vector<float>> F32Constant(const Value* v);

// ---- operands ----

// The two orders of a two-input node's operands, (input 0, input 1) then (input 1, input 0);
// none for a node of another arity. A matcher of a commutative op (Add, Mul) names the
// operands by role and takes the first order that fits:
//
//   for (auto [x, c] : match::OperandOrders(n)) if (IsScalarConstant(c, 2)) return x;
class OperandOrders {
 public:
  using Pair = std::pair<Value*, Value*>;
  explicit OperandOrders(const Node& n);
  const Pair* begin() const { return orders_.data(); }
  const Pair* end() const { return orders_.data() + count_; }

 private:
  std::array<Pair, 2> orders_{};
  size_t count_ = 0;
};

// For a two-input node, the operand beside v (either order); nullptr if v is not an operand.
Value* OtherOperand(const Node& n, const Value* v);

// For a two-input node (commutative) with a scalar constant operand equal to `c` (per
// IsScalarConstant), the other operand, input 1 tried as the constant first; else nullptr.
Value* OperandBesideScalar(const Node& n, double c, ScalarRule rule = {});

// Whether n has exactly two inputs, a and b, in either order.
bool HasOperands(const Node& n, const Value* a, const Value* b);

// Whether a and b hold the same data: one value, or two constants of one dtype and shape with
// equal bytes (as two RoPEs' tables are when each op built its own).
bool SameData(const Value* a, const Value* b);

// ---- axes and shapes ----

// Whether `axis` is -1 or rank - 1: the last dim of a tensor of rank `rank` (> 0).
bool IsLastAxis(int64_t axis, size_t rank);

// [start, end) of the last dim that Slice node n takes, when it takes a contiguous range of
// the last dim (step 1, constant bounds, ONNX clamping) and every other dim whole.
std::optional<std::pair<int64_t, int64_t>> LastAxisSliceRange(const Node& n);

// Whether a tensor of shape `s` broadcasts to exactly `to` (right-aligned, each dim 1 or equal;
// never more dims than `to`).
bool BroadcastsTo(const Shape& s, const Shape& to);

// ---- building ----

// A constant i64 vector named FreshName(name): shapes, axes, slice bounds.
Result<Value*> AddIntsConstant(Graph& g, const std::string& name, const std::vector<int64_t>& v);

// Node n's result replaced by `now` (which takes its name), n removed: n's result must be its
// only output.
Status ReplaceKeepingName(Graph& g, Node* n, Value* now);

// For a Slice taking every other element of the last dim (step 2) and all of the others: where
// it starts (0: the even elements, 1: the odd ones); none otherwise.
std::optional<int64_t> LastAxisEveryOther(const Node& n);

}  // namespace graphfuse::match
