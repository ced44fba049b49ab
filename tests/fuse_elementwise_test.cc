// The fusion planner: graph in (textual IR) -> expected groups; refusals asserted by code;
// fused results checked against the unfused plan on the same random inputs.
#include "passes/fuse_elementwise.h"

#include <gtest/gtest.h>

#include <random>

#include "graph_test_util.h"
#include "ir/text.h"
#include "cpu/executor.h"

namespace graphfuse {
namespace {

std::vector<Tensor> RandomInputs(const Graph& g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-2, 2);
  std::vector<Tensor> ins;
  for (const Value* v : g.inputs()) {
    Tensor t = Tensor::Empty(v->dtype(), v->shape()).value();
    for (int64_t i = 0; i < t.numel(); ++i)
      t.SetFromDouble(i, v->dtype() == DType::kBool ? double(rng() & 1) : IsFloat(v->dtype()) ? u(rng) : double(rng() % 100) - 50);
    ins.push_back(std::move(t));
  }
  return ins;
}

// Runs `text` unfused and fused on the same inputs (`inputs`, else random ones); expects
// identical bits. `unfused_out` receives the unfused plan's outputs.
FusionReport FuseAndCompare(const std::string& text, const FusionOptions& o = {},
                            const std::vector<Tensor>* inputs = nullptr, std::vector<Tensor>* unfused_out = nullptr) {
  auto unfused = Parse(text);
  auto fused = Parse(text);
  auto rep = FuseElementwise(*fused, o);
  EXPECT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_TRUE(fused->Verify().ok()) << fused->Verify().ToString() << "\n" << PrintGraph(*fused);
  const std::vector<Tensor> ins = inputs ? std::vector<Tensor>() : RandomInputs(*unfused, 3);
  std::vector<TensorView> views;
  for (const Tensor& t : inputs ? *inputs : ins) views.push_back(t.view());
  ThreadPool pool(2);
  auto a = Execute(*unfused, views, CpuContext{&pool});
  auto b = Execute(*fused, views, CpuContext{&pool});
  EXPECT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  if (a.ok() && b.ok()) {
    for (size_t k = 0; k < a->size(); ++k)
      EXPECT_EQ(0, std::memcmp((*a)[k].data(), (*b)[k].data(), (*a)[k].nbytes())) << "output " << k;
    if (unfused_out) *unfused_out = std::move(*a);
  }
  return rep.ok() ? *rep : FusionReport{};
}

bool HasRefusal(const FusionReport& r, const std::string& code) {
  for (const auto& x : r.refusals)
    if (x.code == code) return true;
  return false;
}

TEST(FuseElementwise, ChainWithBroadcastOperandsIsOneGroup) {
  auto r = FuseAndCompare(R"(graph @chain(%x: f32[64,4096], %y: f32[64,4096], %b: f32[4096]) {
  %s: f32[] = const [0.125]
  %0 = Add(%x, %y)
  %1 = Mul(%0, %s)
  %u = Add(%1, %b)
  return %u
})");
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_EQ(r.groups[0].nodes, (std::vector<std::string>{"Add_0", "Mul_1", "Add_2"}));
  EXPECT_EQ(r.kernels_before, 3);
  EXPECT_EQ(r.kernels_after, 1);
  EXPECT_EQ(r.groups[0].kernel_name.rfind("fused_add_mul_add_f32_", 0), 0u) << r.groups[0].kernel_name;
}

TEST(FuseElementwise, ActivationsAndDiamonds) {
  auto r = FuseAndCompare(R"(graph @d(%x: f32[3,1000], %s: f32[1000]) {
  %0 = Mul(%x, %s)
  %1 = Gelu(%0)
  %2 = Sigmoid(%0)
  %3 = Mul(%1, %2)
  %4 = Silu(%3)
  return %4
})");
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_EQ(r.groups[0].nodes.size(), 5u);
  EXPECT_EQ(r.kernels_after, 1);
}

TEST(FuseElementwise, MultiConsumerValueBecomesSecondOutput) {
  auto g = Parse(R"(graph @m(%x: f32[512], %y: f32[512], %w: f32[512,512]) {
  %t = Add(%x, %y)
  %r = Relu(%t)
  %m = MatMul(%t, %w)
  return %r, %m
})");
  auto r = FuseElementwise(*g);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->groups.size(), 1u);
  const Node* fused = g->FindValue("r")->producer();
  ASSERT_EQ(fused->op(), "FusedElementwise");
  EXPECT_EQ(fused->outputs().size(), 2u);  // %t for the MatMul, %r for the graph
  EXPECT_TRUE(HasRefusal(*r, refusal::kNotElementwise));
}

TEST(FuseElementwise, SiblingsReadingOneInputMerge) {
  auto r = FuseAndCompare(R"(graph @h(%x: f32[8,256], %bq: f32[256], %bk: f32[256], %bv: f32[256]) {
  %q = Add(%x, %bq)
  %k = Add(%x, %bk)
  %v = Add(%x, %bv)
  return %q, %k, %v
})");
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_EQ(r.groups[0].nodes.size(), 3u);
  EXPECT_EQ(r.kernels_after, 1);
}

TEST(FuseElementwise, RefusesCycleThroughOutsideNode) {
  auto r = FuseAndCompare(R"(graph @c(%x: f32[16,16], %w: f32[16,16]) {
  %a = Neg(%x)
  %c = MatMul(%a, %w)
  %b = Add(%a, %c)
  return %b
})");
  EXPECT_TRUE(r.groups.empty());
  EXPECT_TRUE(HasRefusal(r, refusal::kWouldCreateCycle));
}

// Cut down from an exported model: two groups that no node path joins can still form a cycle
// once merged, through a third group. Here the float group holding Max/Where/Add(sel, mu) and
// the one holding Div/Add(u1)/Pow/Min are each reachable from the other only through the bool
// group (Greater, Cast): merging a node of one into the other must see the path
// (group -> other group -> group), not only paths through single nodes outside both.
constexpr const char* kCycleThroughAThirdGroup = R"(graph @repro(%a: f32[2,16,64], %b: f32[2,16,64],
    %c: f32[2,16,64], %s: f32[2,16,64], %t: f32[2,16,64], %l: f32[2,16,64], %y: f32[2,16,64], %w: f32[64],
    %k1: f32[], %k2: f32[], %k3: f32[], %k4: f32[], %k5: f32[]) {
  %d = Add(%a, %b)
  %u = Div(%c, %w)
  %u1 = Add(%u, %k1)
  %s1 = Add(%s, %k2)
  %p1 = Pow(%u1, %k3)
  %p2 = Pow(%t, %k4)
  %pw = Add(%p1, %p2)
  %mx = Max(%d, %l)
  %mn = Min(%pw, %s1)
  %cond = Greater(%y, %k5)
  %sel = Where(%cond, %mx, %mn)
  %m = Cast(%cond) {to = 0}
  %mu = Mul(%m, %u)
  %z = Add(%sel, %mu)
  %mean = ReduceMean(%z) {axes = [-1], keepdims = 1}
  return %mean
})";

TEST(FuseElementwise, NoCycleThroughAThirdGroup) {
  // Every order of the groups' growth the caps allow: small groups leave other merges open.
  for (int cap : {2, 3, 4, 5, 8, 24}) {
    FusionOptions o;
    o.max_group_size = cap;
    auto r = FuseAndCompare(kCycleThroughAThirdGroup, o);
    EXPECT_GE(r.groups.size(), 1u) << "max_group_size " << cap;
    EXPECT_LT(r.kernels_after, r.kernels_before) << "max_group_size " << cap;
  }
}

// A path may enter a group at a member late in node order and leave it from an early one, so
// node order cannot bound the search: a and d (siblings reading %x) would close
// a -> r1 -> s -> {t, e} -> r2 -> d, where t comes after d and e before it.
TEST(FuseElementwise, NoCycleThroughALateMemberOfAGroup) {
  FusionOptions o;
  o.exclude = {"Mul_5"};  // s stays alone
  auto r = FuseAndCompare(R"(graph @late(%x: f32[8,64], %y: f32[8,64], %z: f32[8,64]) {
  %a = Neg(%x)
  %e = Exp(%y)
  %r2 = ReduceMean(%e) {axes = [-1], keepdims = 1}
  %d = Add(%x, %r2)
  %r1 = ReduceSum(%a) {axes = [-1], keepdims = 1}
  %s = Mul(%r1, %z)
  %t = Add(%s, %e)
  return %d, %t
})", o);
  EXPECT_TRUE(HasRefusal(r, refusal::kWouldCreateCycle));
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_EQ(r.groups[0].nodes, (std::vector<std::string>{"Exp_1", "Add_6"}));
}

TEST(FuseElementwise, RefusesDifferentSpacesAndDomains) {
  auto r = FuseAndCompare(R"(graph @s(%x: f32[4,8], %v: f32[8], %i: i32[4,8], %j: i32[4,8]) {
  %a = Exp(%v)
  %b = Add(%x, %a)
  %c = Add(%i, %j)
  %d = Cast(%c) {to = 0}
  %e = Mul(%b, %d)
  return %e
})");
  EXPECT_TRUE(HasRefusal(r, refusal::kShapeMismatch));
  EXPECT_TRUE(HasRefusal(r, refusal::kDomainMismatch));
}

TEST(FuseElementwise, CapsAndSwitches) {
  std::string text = "graph @long(%x: f32[1024]) {\n";
  std::string prev = "x";
  for (int i = 0; i < 10; ++i) {
    text += StrCat("  %", i, " = ", i % 2 ? "Neg" : "Abs", "(%", prev, ")\n");
    prev = std::to_string(i);
  }
  text += "  return %9\n}\n";
  FusionOptions small;
  small.max_group_size = 4;
  auto r = FuseAndCompare(text, small);
  EXPECT_EQ(r.groups.size(), 3u);  // 4 + 4 + 2
  EXPECT_TRUE(HasRefusal(r, refusal::kGroupTooLarge));
  FusionOptions off;
  off.enabled = false;
  r = FuseAndCompare(text, off);
  EXPECT_TRUE(r.groups.empty());
  EXPECT_TRUE(HasRefusal(r, refusal::kDisabled));
  FusionOptions excl;
  excl.exclude = {"fused_0"};
  r = FuseAndCompare(text, excl);
  EXPECT_TRUE(r.groups.empty());
  EXPECT_TRUE(HasRefusal(r, refusal::kExcluded));
}

TEST(FuseElementwise, HalfPrecisionIntermediatesRoundAsUnfused) {
  FuseAndCompare(R"(graph @h(%x: f16[3,500], %y: f16[500]) {
  %0 = Mul(%x, %y)
  %1 = Exp(%0)
  %2 = Add(%1, %x)
  return %2
})");
  FuseAndCompare(R"(graph @b(%x: bf16[3,500], %y: bf16[500]) {
  %0 = Mul(%x, %y)
  %1 = Tanh(%0)
  %2 = Sub(%1, %x)
  return %2
})");
}

// Integer groups compute in int64 registers; an i32 result must wrap as its store would, and a
// Cast to bool must give 0 / 1, before another op of the group reads it (found by the property
// test: an i32 product past 2^31 compared unwrapped inside the group).
TEST(FuseElementwise, IntegerIntermediatesHoldWhatTheirStoresKeep) {
  const std::string text = R"(graph @i(%x: i32[4,64], %y: i32[4,64]) {
  %sq = Mul(%x, %x)
  %gt = Greater(%sq, %y)
  %b = Cast(%x) {to = 5}
  %bi = Cast(%b) {to = 3}
  %s = Add(%bi, %sq)
  return %gt, %s
})";
  // |x| in [46341, 70000]: x * x is past 2^31 and wraps, to a negative value for some.
  auto g = Parse(text);
  std::mt19937 rng(5);
  std::vector<Tensor> ins;
  for (const Value* v : g->inputs()) {
    Tensor t = Tensor::Empty(v->dtype(), v->shape()).value();
    for (int64_t i = 0; i < t.numel(); ++i)
      t.SetFromDouble(i, v->name() == "x" ? double((46341 + rng() % 23660) * (i % 2 ? 1 : -1)) : double(rng() % 201) - 100);
    ins.push_back(std::move(t));
  }
  std::vector<Tensor> a;
  const FusionReport rep = FuseAndCompare(text, {}, &ins, &a);  // fused == unfused, bit for bit
  ASSERT_EQ(rep.groups.size(), 1u);
  ASSERT_EQ(a.size(), 2u);
  int64_t wrapped_negative = 0;
  for (int64_t i = 0; i < ins[0].numel(); ++i) {
    const int64_t x = static_cast<int64_t>(ins[0].GetAsDouble(i));
    const int32_t sq = static_cast<int32_t>(x * x);
    wrapped_negative += sq < 0;
    EXPECT_EQ(a[0].GetAsDouble(i), sq > ins[1].GetAsDouble(i) ? 1.0 : 0.0) << i;
    EXPECT_EQ(a[1].GetAsDouble(i), static_cast<double>(static_cast<int32_t>(int64_t{sq} + 1))) << i;
  }
  EXPECT_GT(wrapped_negative, 0);  // the data reaches the case
}

TEST(FuseElementwise, RecomputesCheapProducerInsteadOfStoringIt) {
  const std::string text = R"(graph @r(%x: f32[32,32], %w: f32[32,32]) {
  %s: f32[] = const [0.5]
  %a = Mul(%x, %s)
  %c = Neg(%a)
  %m = MatMul(%c, %w)
  %d = Add(%m, %a)
  %e = Exp(%d)
  return %e
})";
  auto r = FuseAndCompare(text);
  ASSERT_EQ(r.groups.size(), 2u);
  EXPECT_EQ(r.groups[1].recomputed, (std::vector<std::string>{"Mul_0"}));
  EXPECT_EQ(r.kernels_after, 3);
  auto g = Parse(text);
  ASSERT_TRUE(FuseElementwise(*g).ok());
  // The first group no longer writes %a: only what the MatMul reads.
  EXPECT_EQ(g->FindValue("m")->producer()->input(0)->producer()->outputs().size(), 1u);
  // With recompute off (max cost 0) the value is stored and read back instead.
  FusionOptions no_recompute;
  no_recompute.recompute_max_cost = 0;
  auto r0 = FuseAndCompare(text, no_recompute);
  EXPECT_TRUE(r0.groups[1].recomputed.empty());
}

TEST(FuseElementwise, KeepsGraphOutputNames) {
  auto g = Parse(R"(graph @n(%x: f32[10]) {
  %a = Neg(%x)
  %out = Exp(%a)
  return %out
})");
  ASSERT_TRUE(FuseElementwise(*g).ok());
  EXPECT_EQ(g->outputs()[0]->name(), "out");
  EXPECT_EQ(g->num_nodes(), 1u);
}

}  // namespace
}  // namespace graphfuse
