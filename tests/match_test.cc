// The pattern-matching helpers the passes share (src/passes/match.h), on small graphs written
// in textual IR: producers and readers, constants read as scalars or as data, commutative
// operands named by role, axes and broadcasts.
#include "passes/match.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "graph_test_util.h"
#include "ir/text.h"

namespace graphfuse {
namespace {

// The value named `name` (a test error if there is none).
Value* V(const Graph& g, const std::string& name) {
  Value* v = g.FindValue(name);
  EXPECT_NE(v, nullptr) << "no value %" << name;
  return v;
}

// The node computing `name`.
Node* N(const Graph& g, const std::string& name) {
  Value* v = V(g, name);
  return v ? v->producer() : nullptr;
}

// x feeds a Relu read twice by one Add; the Add feeds a Mul by a constant and a Sigmoid; both
// are outputs.
constexpr const char* kDiamond = R"(graph @diamond(%x: f32[2,8]) {
  %half: f32[] = const [0.5]
  %r = Relu(%x)
  %a = Add(%r, %r)
  %m = Mul(%half, %a)
  %s = Sigmoid(%a)
  %t = Tanh(%s)
  return %m, %t
})";

TEST(Match, ProducerOf) {
  auto g = Parse(kDiamond);
  EXPECT_EQ(match::ProducerOf(V(*g, "r"), op::Relu), N(*g, "r"));
  EXPECT_EQ(match::ProducerOf(V(*g, "r"), op::Add), nullptr);  // another op
  EXPECT_EQ(match::ProducerOf(V(*g, "x"), op::Relu), nullptr);  // a graph input
  EXPECT_EQ(match::ProducerOf(V(*g, "half"), op::Relu), nullptr);  // a constant
  EXPECT_EQ(match::ProducerOf(nullptr, op::Relu), nullptr);  // an omitted input
}

TEST(Match, SingleUse) {
  auto g = Parse(kDiamond);
  // %r is read twice by the same Add: two uses.
  EXPECT_FALSE(match::HasSingleUse(V(*g, "r")));
  EXPECT_EQ(match::SingleUse(V(*g, "r")), nullptr);
  // %a has two readers.
  EXPECT_FALSE(match::HasSingleUse(V(*g, "a")));
  // %s is read by Tanh only.
  ASSERT_TRUE(match::HasSingleUse(V(*g, "s")));
  const Use* u = match::SingleUse(V(*g, "s"));
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(u->node, N(*g, "t"));
  EXPECT_EQ(u->input_index, 0);
  // A graph output is never private, read once or not.
  EXPECT_FALSE(match::HasSingleUse(V(*g, "m")));
  EXPECT_FALSE(match::HasSingleUse(nullptr));
}

TEST(Match, SingleUseProducer) {
  auto g = Parse(R"(graph @g(%x: f32[4]) {
  %e = Exp(%x)
  %n = Neg(%e)
  %y = Add(%n, %e)
  return %y
})");
  EXPECT_EQ(match::SingleUseProducer(V(*g, "n"), op::Neg), N(*g, "n"));
  EXPECT_EQ(match::SingleUseProducer(V(*g, "n"), op::Exp), nullptr);  // the wrong op
  EXPECT_EQ(match::SingleUseProducer(V(*g, "e"), op::Exp), nullptr);  // read twice
  EXPECT_EQ(match::SingleUseProducer(V(*g, "y"), op::Add), nullptr);  // a graph output
}

TEST(Match, IsUsedOutside) {
  auto g = Parse(kDiamond);
  const Node* add = N(*g, "a");
  const Node* mul = N(*g, "m");
  const Node* sig = N(*g, "s");
  EXPECT_FALSE(match::IsUsedOutside(V(*g, "r"), add));  // both uses are the Add
  EXPECT_TRUE(match::IsUsedOutside(V(*g, "a"), mul));   // the Sigmoid reads it too
  EXPECT_FALSE(match::IsUsedOutside(V(*g, "a"), std::set<const Node*>{mul, sig}));
  EXPECT_TRUE(match::IsUsedOutside(V(*g, "a"), std::set<const Node*>{mul}));
  // A graph output is needed outside whoever reads it.
  EXPECT_TRUE(match::IsUsedOutside(V(*g, "m"), std::set<const Node*>{}));
}

TEST(Match, ReachableFrom) {
  auto g = Parse(kDiamond);
  const Node* relu = N(*g, "r");
  const Node* add = N(*g, "a");
  const Node* mul = N(*g, "m");
  const Node* sig = N(*g, "s");
  const Node* tanh = N(*g, "t");
  EXPECT_EQ(match::ReachableFrom({relu}), (std::set<const Node*>{add, mul, sig, tanh}));
  // Nodes in `stop` are neither entered nor counted.
  EXPECT_EQ(match::ReachableFrom({add}, {sig}), (std::set<const Node*>{mul}));
  // A node of `from` counts only when another reaches it.
  EXPECT_EQ(match::ReachableFrom({add, sig}, {mul}), (std::set<const Node*>{sig, tanh}));
  EXPECT_TRUE(match::ReachableFrom({tanh}).empty());
}

TEST(Match, IsElementwiseOp) {
  auto g = Parse(R"(graph @g(%x: f32[2,4], %w: f32[4,4]) {
  %m = MatMul(%x, %w)
  %r = Relu(%m)
  %s = Softmax(%r) {axis = -1}
  return %s
})");
  EXPECT_TRUE(match::IsElementwiseOp(*N(*g, "r")));
  EXPECT_FALSE(match::IsElementwiseOp(*N(*g, "m")));
  EXPECT_FALSE(match::IsElementwiseOp(*N(*g, "s")));
}

TEST(Match, ScalarConstant) {
  auto g = Parse(R"(graph @g(%x: f32[1]) {
  %f: f32[] = const [0.5]
  %f1: f32[1] = const [-2.0]
  %f4: f32[1,1,1,1] = const [8.0]
  %h: f16[] = const [0.25]
  %i: i64[] = const [2]
  %b: bool[] = const [1]
  %two: f32[2] = const [1.0, 1.0]
  %y = Relu(%x)
  return %y
})");
  EXPECT_EQ(match::ScalarConstant(V(*g, "f")), 0.5);
  EXPECT_EQ(match::ScalarConstant(V(*g, "f1")), -2.0);
  EXPECT_EQ(match::ScalarConstant(V(*g, "h")), 0.25);
  // Any rank by default; at most [1] with max_rank 1.
  EXPECT_EQ(match::ScalarConstant(V(*g, "f4")), 8.0);
  const match::ScalarRule as_written{.integers = true, .max_rank = 1};
  EXPECT_EQ(match::ScalarConstant(V(*g, "f4"), as_written), std::nullopt);
  EXPECT_EQ(match::ScalarConstant(V(*g, "f1"), as_written), -2.0);
  // Integers only when asked; bool never.
  EXPECT_EQ(match::ScalarConstant(V(*g, "i")), std::nullopt);
  EXPECT_EQ(match::ScalarConstant(V(*g, "i"), as_written), 2.0);
  EXPECT_EQ(match::ScalarConstant(V(*g, "b"), as_written), std::nullopt);
  // Not one element, not a constant, not there.
  EXPECT_EQ(match::ScalarConstant(V(*g, "two")), std::nullopt);
  EXPECT_EQ(match::ScalarConstant(V(*g, "x")), std::nullopt);
  EXPECT_EQ(match::ScalarConstant(V(*g, "y")), std::nullopt);
  EXPECT_EQ(match::ScalarConstant(nullptr), std::nullopt);
}

TEST(Match, IsScalarConstantComparesInF32WithRelativeTolerance) {
  auto g = Parse(R"(graph @g(%x: f32[1]) {
  %half: f32[] = const [0.5]
  %near: f32[] = const [0.5001]
  %inv_sqrt2: f32[] = const [0.70710677]
  %i: i32[1] = const [3]
  %y = Relu(%x)
  return %y
})");
  EXPECT_TRUE(match::IsScalarConstant(V(*g, "half"), 0.5));
  EXPECT_FALSE(match::IsScalarConstant(V(*g, "near"), 0.5));
  EXPECT_TRUE(match::IsScalarConstant(V(*g, "inv_sqrt2"), 0.70710678118654752));
  EXPECT_FALSE(match::IsScalarConstant(V(*g, "i"), 3.0));
  EXPECT_TRUE(match::IsScalarConstant(V(*g, "i"), 3.0, {.integers = true}));
  EXPECT_FALSE(match::IsScalarConstant(V(*g, "x"), 0.0));
}

TEST(Match, IntAndF32Constants) {
  auto g = Parse(R"(graph @g(%x: f32[1]) {
  %i64: i64[3] = const [1, -1, 7]
  %i32: i32[2] = const [4, 5]
  %f: f32[2] = const [1.5, -3.0]
  %y = Relu(%x)
  return %y
})");
  EXPECT_EQ(match::IntConstant(V(*g, "i64")), (std::vector<int64_t>{1, -1, 7}));
  EXPECT_EQ(match::IntConstant(V(*g, "i32")), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(match::IntConstant(V(*g, "f")), std::nullopt);
  EXPECT_EQ(match::IntConstant(V(*g, "x")), std::nullopt);
  EXPECT_EQ(match::IntConstant(nullptr), std::nullopt);
  EXPECT_EQ(match::F32Constant(V(*g, "f")), (std::vector<float>{1.5f, -3.0f}));
  EXPECT_EQ(match::F32Constant(V(*g, "i32")), std::nullopt);
  EXPECT_EQ(match::F32Constant(V(*g, "y")), std::nullopt);
}

TEST(Match, OperandOrders) {
  auto g = Parse(kDiamond);
  const Node* mul = N(*g, "m");
  std::vector<std::pair<Value*, Value*>> seen;
  for (auto [x, c] : match::OperandOrders(*mul)) seen.push_back({x, c});
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], std::make_pair(V(*g, "half"), V(*g, "a")));
  EXPECT_EQ(seen[1], std::make_pair(V(*g, "a"), V(*g, "half")));
  // A one-input node has no operand pairs.
  int unary = 0;
  for (auto pair : match::OperandOrders(*N(*g, "s"))) unary += pair.first != nullptr;
  EXPECT_EQ(unary, 0);
}

TEST(Match, OtherOperandAndHasOperands) {
  auto g = Parse(kDiamond);
  const Node& mul = *N(*g, "m");
  const Node& add = *N(*g, "a");
  EXPECT_EQ(match::OtherOperand(mul, V(*g, "a")), V(*g, "half"));
  EXPECT_EQ(match::OtherOperand(mul, V(*g, "half")), V(*g, "a"));
  EXPECT_EQ(match::OtherOperand(mul, V(*g, "x")), nullptr);
  EXPECT_EQ(match::OtherOperand(add, V(*g, "r")), V(*g, "r"));  // Add(r, r)
  EXPECT_EQ(match::OtherOperand(*N(*g, "s"), V(*g, "a")), nullptr);  // not two inputs
  EXPECT_TRUE(match::HasOperands(mul, V(*g, "a"), V(*g, "half")));
  EXPECT_TRUE(match::HasOperands(mul, V(*g, "half"), V(*g, "a")));
  EXPECT_FALSE(match::HasOperands(mul, V(*g, "a"), V(*g, "a")));
  EXPECT_TRUE(match::HasOperands(add, V(*g, "r"), V(*g, "r")));
  EXPECT_FALSE(match::HasOperands(*N(*g, "s"), V(*g, "a"), nullptr));
}

TEST(Match, OperandBesideScalarTriesInputOneFirst) {
  auto g = Parse(R"(graph @g(%x: f32[4]) {
  %one: f32[] = const [1.0]
  %two: f32[] = const [2.0]
  %a = Add(%x, %one)
  %b = Add(%one, %x)
  %c = Mul(%one, %one)
  %d = Mul(%two, %one)
  %e = Mul(%x, %two)
  return %a, %b, %c, %d, %e
})");
  EXPECT_EQ(match::OperandBesideScalar(*N(*g, "a"), 1.0), V(*g, "x"));
  EXPECT_EQ(match::OperandBesideScalar(*N(*g, "b"), 1.0), V(*g, "x"));
  EXPECT_EQ(match::OperandBesideScalar(*N(*g, "c"), 1.0), V(*g, "one"));
  EXPECT_EQ(match::OperandBesideScalar(*N(*g, "d"), 1.0), V(*g, "two"));  // input 1 is the 1
  EXPECT_EQ(match::OperandBesideScalar(*N(*g, "d"), 2.0), V(*g, "one"));
  EXPECT_EQ(match::OperandBesideScalar(*N(*g, "e"), 1.0), nullptr);
}

TEST(Match, IsLastAxis) {
  EXPECT_TRUE(match::IsLastAxis(-1, 3));
  EXPECT_TRUE(match::IsLastAxis(2, 3));
  EXPECT_FALSE(match::IsLastAxis(1, 3));
  EXPECT_FALSE(match::IsLastAxis(-2, 3));
  EXPECT_FALSE(match::IsLastAxis(-1, 0));  // a scalar has no last axis
  EXPECT_FALSE(match::IsLastAxis(0, 0));
  EXPECT_TRUE(match::IsLastAxis(0, 1));
}

TEST(Match, BroadcastsTo) {
  EXPECT_TRUE(match::BroadcastsTo({}, {2, 3}));
  EXPECT_TRUE(match::BroadcastsTo({3}, {2, 3}));
  EXPECT_TRUE(match::BroadcastsTo({1, 3}, {2, 3}));
  EXPECT_TRUE(match::BroadcastsTo({2, 3}, {2, 3}));
  EXPECT_TRUE(match::BroadcastsTo({1}, {0}));
  EXPECT_FALSE(match::BroadcastsTo({2}, {2, 3}));     // dims differ
  EXPECT_FALSE(match::BroadcastsTo({2, 1}, {1, 1}));  // it would widen `to`
  EXPECT_FALSE(match::BroadcastsTo({1, 2, 3}, {2, 3}));  // more dims than `to`
}

}  // namespace
}  // namespace graphfuse
