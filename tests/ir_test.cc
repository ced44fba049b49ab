// Graph IR: builder, verifier, textual printer/parser, rewriting; the unfused executor;
// constant folding; the limits of a fused elementwise body.
#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "cpu/cpu_target.h"
#include "graphfuse/graph.h"
#include "cpu/lower_group.h"
#include "ir/elementwise_body.h"
#include "ir/op_registry.h"
#include "ir/text.h"
#include "passes/fold_constants.h"
#include "passes/pipeline.h"
#include "cpu/executor.h"

namespace graphfuse {
namespace {

constexpr const char* kChain = R"(graph @chain(%x: f32[4,8], %y: f32[4,8], %b: f32[8]) {
  %s: f32[] = const [0.5]
  %0: f32[4,8] = Add(%x, %y)
  %1: f32[4,8] = Mul(%0, %s)
  %2: f32[4,8] = Add(%1, %b)
  %3: f32[4,8] = LeakyRelu(%2) {alpha = 0.100000001}
  return %3
}
)";

TEST(IrText, PrintParseRoundTripIsExact) {
  auto g = ParseGraph(kChain);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE((*g)->Verify().ok());
  EXPECT_EQ(PrintGraph(**g), kChain);
  auto again = ParseGraph(PrintGraph(**g));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(PrintGraph(**again), kChain);
}

TEST(IrText, ParseErrorsSayWhereAndWhat) {
  auto bad_type = ParseGraph("graph @g(%x: f32[4]) {\n  %0: f32[5] = Neg(%x)\n  return %0\n}\n");
  ASSERT_FALSE(bad_type.ok());
  EXPECT_NE(bad_type.status().message().find("2:"), std::string::npos) << bad_type.status().message();
  EXPECT_NE(bad_type.status().message().find("f32[4]"), std::string::npos);
  auto undefined = ParseGraph("graph @g(%x: f32[4]) {\n  %0 = Neg(%zz)\n  return %0\n}");
  ASSERT_FALSE(undefined.ok());
  EXPECT_NE(undefined.status().message().find("undefined value %zz"), std::string::npos);
  auto unknown = ParseGraph("graph @g(%x: f32[4]) {\n  %0 = Frob(%x)\n  return %0\n}");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("Frob"), std::string::npos);
  auto shapes = ParseGraph("graph @g(%x: f32[4], %y: f32[3]) {\n  %0 = Add(%x, %y)\n  return %0\n}");
  ASSERT_FALSE(shapes.ok());
  EXPECT_NE(shapes.status().message().find("[4] and [3]"), std::string::npos) << shapes.status().message();
}

TEST(Graph, UsesProducersAndRewrites) {
  auto g = std::move(ParseGraph(kChain).value());
  Value* v0 = g->FindValue("0");
  ASSERT_NE(v0, nullptr);
  EXPECT_EQ(v0->producer()->op(), "Add");
  ASSERT_EQ(v0->uses().size(), 1u);
  EXPECT_EQ(v0->uses()[0].node->op(), "Mul");
  // Bypass the LeakyRelu: the graph returns %2 and the LeakyRelu becomes dead.
  g->ReplaceAllUsesWith(g->FindValue("3"), g->FindValue("2"));
  EXPECT_EQ(g->RemoveDeadNodes(), 1);
  EXPECT_EQ(g->num_nodes(), 3u);
  EXPECT_TRUE(g->Verify().ok());
  EXPECT_EQ(g->outputs()[0]->name(), "2");
}

TEST(Graph, BuilderRejectsBadNodes) {
  Graph g;
  Value* x = g.AddInput("x", DType::kF32, {4}).value();
  auto arity = g.AddNode("Add", {x});
  ASSERT_FALSE(arity.ok());
  EXPECT_NE(arity.status().message().find("takes 2"), std::string::npos) << arity.status().message();
  auto unknown = g.AddNode("NoSuchOp", {x}, {}, "n7");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("node 'n7' (NoSuchOp)"), std::string::npos);
  EXPECT_FALSE(g.AddInput("x", DType::kF32, {4}).ok());  // defined twice
}

TEST(Executor, MatchesOpByOpAndReusesBuffers) {
  // A 12-op chain: the executor needs only a few live buffers.
  std::string text = "graph @long(%x: f32[64,256]) {\n";
  std::string prev = "x";
  const char* ops[] = {"Neg", "Exp", "Sigmoid", "Abs", "Sqrt", "Tanh", "Relu", "Silu", "Neg", "Abs", "Gelu", "Erf"};
  for (int i = 0; i < 12; ++i) {
    text += StrCat("  %", i, " = ", ops[i], "(%", prev, ")\n");
    prev = std::to_string(i);
  }
  text += "  return %11\n}\n";
  auto g = std::move(ParseGraph(text).value());
  Tensor x = Tensor::Empty(DType::kF32, {64, 256}).value();
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-3, 3);
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = u(rng);
  ThreadPool pool(2);
  ExecStats stats;
  TensorView xv = x.view();
  auto out = Execute(*g, {&xv, 1}, CpuContext{&pool}, &stats);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(stats.kernels_launched, 12);
  // 11 intermediates of 64 KiB each, but only 2 live at once.
  EXPECT_EQ(stats.peak_activation_bytes, 2 * 64 * 256 * 4);
  EXPECT_EQ(stats.activation_bytes_no_reuse, 12 * 64 * 256 * 4);
  // Same result as running the ops one by one.
  Tensor cur = Tensor::Empty(DType::kF32, {64, 256}).value();
  std::memcpy(cur.data(), x.data(), x.nbytes());
  for (const char* op : ops) {
    TensorView v = cur.view();
    OpKind k = OpFromName(op).value();
    cur = RunOp(k, {&v, 1}, DefaultAttrs(k), CpuContext{}).value();
  }
  EXPECT_EQ(0, std::memcmp(cur.data(), (*out)[0].data(), cur.nbytes()));
}

// A compiled plan keeps each kernel's planned launch while its buffers stay put, and plans it
// again when the caller hands other input / output buffers: results follow the data given.
TEST(Executor, RunsAgainOnOtherBuffers) {
  auto g = std::move(ParseGraph(R"(graph @g(%x: f32[8,100], %y: f32[8,100]) {
  %0 = Add(%x, %y)
  %1 = Mul(%0, %x)
  %2 = Neg(%1)
  return %2
})").value());
  auto plan = ExecutionPlan::Compile(*g);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-2, 2);
  auto fresh = [&] {
    Tensor t = Tensor::Empty(DType::kF32, {8, 100}).value();
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = u(rng);
    return t;
  };
  Tensor xa = fresh(), ya = fresh(), xb = fresh(), yb = fresh();
  Tensor oa = Tensor::Empty(DType::kF32, {8, 100}).value(), ob = Tensor::Empty(DType::kF32, {8, 100}).value();
  auto check = [&](const Tensor& x, const Tensor& y, Tensor& out) {
    const TensorView in[] = {x.view(), y.view()};
    const TensorView o[] = {out.view()};
    ASSERT_TRUE((*plan)->Run(in, o, CpuContext{}).ok());
    for (int64_t i = 0; i < out.numel(); ++i) {
      const float xv = x.data_as<float>()[i], yv = y.data_as<float>()[i];
      ASSERT_EQ(out.data_as<float>()[i], -((xv + yv) * xv)) << i;
    }
  };
  check(xa, ya, oa);
  check(xa, ya, oa);  // reused launch
  check(xb, yb, ob);  // other buffers: planned again
  check(xb, ya, oa);  // mixed
  for (int64_t i = 0; i < xa.numel(); ++i) xa.data_as<float>()[i] = u(rng);
  check(xa, ya, oa);  // same buffers, new values
}

TEST(Executor, RejectsWrongInputs) {
  auto g = std::move(ParseGraph(kChain).value());
  Tensor x = Tensor::Empty(DType::kF32, {4, 7}).value();
  TensorView v[] = {x.view(), x.view(), x.view()};
  auto r = Execute(*g, v, CpuContext{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'x' is f32[4,8], got f32[4,7]"), std::string::npos) << r.status().message();
  auto few = Execute(*g, {v, 1}, CpuContext{});
  ASSERT_FALSE(few.ok());
  EXPECT_NE(few.status().message().find("takes 3 inputs"), std::string::npos);
}

TEST(FoldConstants, FoldsConstantSubgraphs) {
  auto g = std::move(ParseGraph(R"(graph @f(%x: f32[3]) {
  %a: f32[3] = const [1.0, 2.0, 3.0]
  %b: f32[3] = const [0.5, 0.5, 0.5]
  %0 = Mul(%a, %b)
  %1 = Exp(%0)
  %2 = Add(%x, %1)
  return %2
}
)").value());
  auto folded = FoldConstants(*g, FoldOptions{&cpu::DefaultCpuTarget()});
  ASSERT_TRUE(folded.ok());
  EXPECT_EQ(*folded, 2);
  EXPECT_EQ(g->num_nodes(), 1u);
  EXPECT_TRUE(g->Verify().ok()) << g->Verify().ToString();
  const Value* c = g->FindValue("1");
  ASSERT_TRUE(c && c->constant());
  EXPECT_FLOAT_EQ(c->constant()->data_as<float>()[2], std::exp(1.5f));
}

// CheckElementwiseBody (what FuseGemm asks of an epilogue) accepts exactly the bodies the CPU
// lowering takes, with the same errors.
TEST(ElementwiseBody, CheckAgreesWithTheCpuLowering) {
  // A chain of `nodes` Adds over `inputs` f32[4] inputs (read again when the chain is longer
  // than the inputs), optionally ending in a Softmax.
  auto body = [](size_t inputs, size_t nodes, bool softmax) {
    auto g = std::make_unique<Graph>("body");
    std::vector<Value*> in;
    for (size_t i = 0; i < inputs; ++i) in.push_back(g->AddInput(StrCat("x", i), DType::kF32, {4}).value());
    Value* acc = in[0];
    for (size_t k = 0; k < nodes; ++k) acc = g->AddNode("Add", {acc, in[(k + 1) % inputs]}).value()->output();
    if (softmax) acc = g->AddNode("Softmax", {acc}).value()->output();
    EXPECT_TRUE(g->MarkOutput(acc).ok());
    return g;
  };
  struct Case {
    size_t inputs, nodes;
    bool softmax;
    const char* error;  // nullptr: accepted
  };
  for (const Case& c : {Case{kMaxBodyInputs, 20, false, nullptr}, Case{kMaxBodyInputs + 1, 20, false, "(at most"},
                        Case{2, kMaxBodyInstrs, false, nullptr}, Case{2, kMaxBodyInstrs + 1, false, "instructions"},
                        Case{2, 3, true, "is not elementwise"}}) {
    const auto g = body(c.inputs, c.nodes, c.softmax);
    const Status check = CheckElementwiseBody(*g);
    const Result<cpu::TileProgram> lowered = cpu::LowerElementwiseGroup(*g);
    EXPECT_EQ(check.ok(), c.error == nullptr) << c.inputs << " inputs, " << c.nodes << " nodes: " << check.ToString();
    EXPECT_EQ(lowered.ok(), check.ok());
    if (!c.error) continue;
    EXPECT_NE(check.message().find(c.error), std::string::npos) << check.ToString();
    EXPECT_EQ(lowered.status().ToString(), check.ToString());
  }
}

// IsInf's ONNX attributes choose which infinities count, alone and inside a fused group.
TEST(Elementwise, IsInfDetectsTheInfinitiesAskedFor) {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor x = Tensor::Empty(DType::kF32, {5}).value();
  const float xs[] = {-inf, inf, 1.f, std::numeric_limits<float>::quiet_NaN(), -2.f};
  for (int i = 0; i < 5; ++i) x.SetFromDouble(i, xs[i]);
  const TensorView in[] = {x.view()};
  struct Case {
    const char* attrs;
    std::vector<int> want;  // IsInf(x), then IsInf(x + x) from a fused group
  };
  for (const Case& c : {Case{"", {1, 1, 0, 0, 0}}, Case{"{detect_negative = 0}", {0, 1, 0, 0, 0}},
                        Case{"{detect_positive = 0}", {1, 0, 0, 0, 0}}}) {
    for (bool fuse : {false, true}) {
      auto g = ParseGraph(std::string(R"(graph @g(%x: f32[5]) {
  %d = Add(%x, %x)
  %y = IsInf(%d) )") + c.attrs + R"(
  return %y
})");
      ASSERT_TRUE(g.ok()) << g.status().ToString();
      PipelineOptions o;
      o.fusion.enabled = fuse;
      ASSERT_TRUE(RunPipeline(**g, cpu::DefaultCpuTarget(), o).ok());
      auto y = Execute(**g, in, CpuContext{});
      ASSERT_TRUE(y.ok()) << y.status().ToString();
      ASSERT_EQ(y->at(0).dtype(), DType::kBool);
      for (int i = 0; i < 5; ++i) EXPECT_EQ(y->at(0).GetAsDouble(i), c.want[i]) << c.attrs << (fuse ? " fused" : "") << " at " << i;
    }
  }
}

// GatherElements along axis 1 with a negative index, and an index out of range named; Trilu on
// integers with k from an input.
TEST(DataMovement, GatherElementsAndTrilu) {
  auto g = ParseGraph(R"(graph @g(%x: f32[2,3], %i: i64[2,2]) {
  %y = GatherElements(%x, %i) {axis = 1}
  return %y
})");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  Tensor x = Tensor::FromFloats(DType::kF32, {2, 3}, {1, 2, 3, 4, 5, 6}).value();
  Tensor i = Tensor::Empty(DType::kI64, {2, 2}).value();
  const int64_t is[] = {2, -3, 1, 1};
  for (int k = 0; k < 4; ++k) i.SetFromDouble(k, static_cast<double>(is[k]));
  const TensorView in[] = {x.view(), i.view()};
  auto y = Execute(**g, in, CpuContext{});
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  const double want[] = {3, 1, 5, 5};
  for (int k = 0; k < 4; ++k) EXPECT_EQ(y->at(0).GetAsDouble(k), want[k]) << k;
  i.SetFromDouble(3, 3);
  auto bad = Execute(**g, in, CpuContext{});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("index 3 (position 3) is out of range for axis 1 of size 3"), std::string::npos)
      << bad.status().ToString();

  auto t = ParseGraph(R"(graph @t(%x: i32[3,3], %k: i64[]) {
  %y = Trilu(%x, %k) {upper = 0}
  return %y
})");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Tensor xi = Tensor::Empty(DType::kI32, {3, 3}).value();
  for (int k = 0; k < 9; ++k) xi.SetFromDouble(k, k + 1);
  Tensor kk = Tensor::Empty(DType::kI64, {}).value();
  kk.SetFromDouble(0, -1);
  const TensorView tin[] = {xi.view(), kk.view()};
  auto ty = Execute(**t, tin, CpuContext{});
  ASSERT_TRUE(ty.ok()) << ty.status().ToString();
  const double lower[] = {0, 0, 0, 4, 0, 0, 7, 8, 0};  // below the diagonal only (k = -1)
  for (int k = 0; k < 9; ++k) EXPECT_EQ(ty->at(0).GetAsDouble(k), lower[k]) << k;
}

// ArgMax takes a NaN as the largest (its first one, as numpy does); select_last_index picks the
// last of equal extremes.
TEST(Reduce, ArgMaxNaNAndLastIndex) {
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"%y = ArgMax(%x) {axis = 1, keepdims = 0}", {1, 1}},
           {"%y = ArgMin(%x) {axis = 1, keepdims = 0, select_last_index = 1}", {1, 2}},
           {"%y = ArgMin(%x) {axis = 1}", {1, 0}}}) {
    auto g = ParseGraph("graph @g(%x: f32[2,3]) {\n  " + text + "\n  return %y\n}");
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    // Row 0 holds NaNs (the extreme for both ops), row 1 a tie of minima.
    Tensor x = Tensor::FromFloats(DType::kF32, {2, 3}, {1, nan, nan, -2, 5, -2}).value();
    const TensorView in[] = {x.view()};
    auto y = Execute(**g, in, CpuContext{});
    ASSERT_TRUE(y.ok()) << y.status().ToString();
    ASSERT_EQ(y->at(0).numel(), static_cast<int64_t>(want.size())) << text;
    for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(y->at(0).GetAsDouble(k), want[k]) << text << " at " << k;
  }
}

}  // namespace
}  // namespace graphfuse

namespace graphfuse {
namespace {

// op::Id and the registry name the same ops: every schema has the id of its name, every id a
// schema, and FindSchema by id is FindSchema by name. The op table's rows come first, in order.
TEST(OpIds, EverySchemaHasAnIdAndEveryIdASchema) {
  for (const OpSchema* s : AllSchemas()) {
    const op::Id id = op::FromName(s->name);
    ASSERT_NE(id, op::kUnknown) << s->name << " is registered but has no op::Id (include/graphfuse/op_names.def)";
    EXPECT_STREQ(op::Name(id), s->name);
    EXPECT_EQ(FindSchema(id), s) << s->name;
  }
  for (int i = 0; i < op::kCount; ++i) {
    const op::Id id = static_cast<op::Id>(i);
    EXPECT_NE(FindSchema(id), nullptr) << op::Name(id) << " has an op::Id but no schema";
    EXPECT_EQ(op::FromName(op::Name(id)), id);
  }
  EXPECT_EQ(static_cast<int>(AllSchemas().size()), op::kCount);
  for (const OpInfo& row : AllOps()) {
    EXPECT_TRUE(op::IsTableRow(op::FromName(row.name))) << row.name;
    EXPECT_EQ(op::ToOpKind(op::FromName(row.name)), row.kind) << row.name;
  }
  EXPECT_FALSE(op::IsTableRow(op::MatMul));
  EXPECT_TRUE(op::IsFused(op::FusedElementwise) && op::IsFused(op::FusedCachedAttention));
  EXPECT_FALSE(op::IsFused(op::MatMul) || op::IsFused(op::Add) || op::IsFused(op::kUnknown));
  EXPECT_EQ(op::FromName("matmul"), op::kUnknown);  // names are case-sensitive
  EXPECT_STREQ(op::Name(op::kUnknown), "?");
  EXPECT_EQ(FindSchema(op::kUnknown), nullptr);
}

// A node knows its op's id from its name, whichever way it was added.
TEST(OpIds, NodesCarryTheirOpsId) {
  Graph g;
  Value* x = g.AddInput("x", DType::kF32, {2, 3}).value();
  Node* a = g.AddNode(op::Relu, {x}).value();
  Node* b = g.AddNode("Exp", {a->output()}).value();
  EXPECT_TRUE(a->is(op::Relu));
  EXPECT_EQ(a->op(), "Relu");
  EXPECT_TRUE(b->is(op::Exp));
  EXPECT_FALSE(b->is(op::Relu));
  EXPECT_EQ(b->op_id(), op::Exp);
  Node* t = g.AddNodeTyped("NotAnOp", {x}, {}, {ValueType{DType::kF32, {2, 3}}});
  EXPECT_EQ(t->op_id(), op::kUnknown);
}

}  // namespace
}  // namespace graphfuse
