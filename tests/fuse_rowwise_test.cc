// Row-op fusion (fuse_rowwise.cc): graphs in textual IR -> the FusedNorm / FusedSoftmax nodes
// and report expected; refusals asserted by code; fused results checked against the unfused
// plan, against float64 computations written here, and against each node's "reference" graph
// (what `graphfuse run --check-fusion` executes).
#include <gtest/gtest.h>

#include "cpu/cpu_target.h"
#include "graph_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "ir/text.h"
#include "passes/fusion_passes.h"
#include "passes/pipeline.h"
#include "cpu/executor.h"

namespace graphfuse {
namespace {

// The planner stages this pass depends on, then the pass itself.
FusionReport Plan(Graph& g, const FusionOptions& o = {}) {
  auto rep = FuseElementwise(g, o);
  EXPECT_TRUE(rep.ok()) << rep.status().ToString();
  if (!rep.ok()) return {};
  auto formed = FuseRowwise(g, o, &*rep);
  EXPECT_TRUE(formed.ok()) << formed.status().ToString();
  Status v = g.Verify();
  EXPECT_TRUE(v.ok()) << v.ToString() << "\n" << PrintGraph(g);
  rep->kernels_after = CountKernels(g);
  return *rep;
}

// Fresh random inputs, never zero (|v| in [0.05, 2]); `zero_one` inputs hold a dropout keep
// mask (0 or 1.25), `mask` inputs an additive attention mask (0 or -1e4).
// Fresh data; "keep" is a dropout keep-mask (1.25 or 0), "mask" an additive mask (0 or -1e4).
std::vector<Tensor> RowwiseInputs(const Graph& g, uint32_t seed) {
  return RandomInputs(g, seed, 0.05, 2.0, [](const Value& v, int64_t, std::mt19937& rng) -> std::optional<double> {
    if (v.name() == "keep") return (rng() % 5) ? 1.25 : 0.0;
    if (v.name() == "mask") return (rng() % 4) ? 0.0 : -1e4;
    return std::nullopt;
  });
}

// Elementwise |a - b| <= atol + rtol * |b| (numpy.allclose); returns the worst |a - b|.
double ExpectClose(const Tensor& a, const Tensor& b, double rtol, double atol, const std::string& what) {
  EXPECT_EQ(a.shape(), b.shape()) << what;
  double worst = 0;
  int bad = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) {
    const double x = a.GetAsDouble(i), y = b.GetAsDouble(i);
    const double err = std::fabs(x - y);
    worst = std::max(worst, err);
    if (!(err <= atol + rtol * std::fabs(y)) && bad++ < 3)
      ADD_FAILURE() << what << ": element " << i << " is " << x << ", expected " << y << " (|err| " << err << ")";
  }
  return worst;
}

// Tolerances, fused vs unfused. The fused kernels do the same f32 operations in the same order
// as the unfused ones: each elementwise op is correctly rounded in both, the norm statistics
// are double sums with the same partial-sum order, softmax uses the same vector exp, lane sums
// and reciprocal, and the project compiles with -ffp-contract=off (no FMA contraction that one
// translation unit could apply and another not). So the two agree bit for bit; 2 ulp relative
// (2^-22), with an atol of 2 ulp of 1 for results near 0 (rows are O(1) here), leaves room
// for a build with other flags and for nothing that would be a real difference.
constexpr double kFusedRtol = 1.0 / (1 << 22), kFusedAtol = 1.0 / (1 << 22);

// Parses `text` twice, runs the pipeline fused and unfused on the same random inputs and
// compares. Returns the fused graph's report.
FusionReport CompareFusedUnfused(const std::string& text, std::unique_ptr<Graph>* fused_out = nullptr,
                                 std::vector<Tensor>* fused_results = nullptr,
                                 std::vector<Tensor>* inputs_out = nullptr) {
  auto unfused = Parse(text), fused = Parse(text);
  PipelineOptions off;
  off.fusion.enabled = false;
  EXPECT_TRUE(RunPipeline(*unfused, cpu::DefaultCpuTarget(), off).ok());
  FusionReport report;
  PipelineOptions on;
  on.fusion_report = &report;
  auto rec = RunPipeline(*fused, cpu::DefaultCpuTarget(), on);
  EXPECT_TRUE(rec.ok()) << rec.status().ToString();
  std::vector<Tensor> ins = RowwiseInputs(*unfused, 11);
  ThreadPool pool(4);
  CpuContext ctx{&pool};
  ctx.min_work_per_thread = 4096;  // several threads even for these small tensors
  auto a = Execute(*unfused, Views(ins), ctx);
  auto b = Execute(*fused, Views(ins), ctx);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  if (a.ok() && b.ok()) {
    EXPECT_EQ(a->size(), b->size());
    for (size_t k = 0; k < std::min(a->size(), b->size()); ++k)
      ExpectClose((*b)[k], (*a)[k], kFusedRtol, kFusedAtol, StrCat("output ", unfused->outputs()[k]->name()));
    if (fused_results) *fused_results = std::move(*b);
  }
  if (fused_out) *fused_out = std::move(fused);
  if (inputs_out) *inputs_out = std::move(ins);
  return report;
}

// ---- the plans ----

// The LLaMA block's residual stream: h = x + r is normalized and also read by the next residual
// add (after the MLP's MatMul, so the elementwise planner cannot merge the two adds).
constexpr const char* kResidualRmsNorm = R"(graph @block(%x: f32[16,256], %r: f32[16,256], %w: f32[256], %wm: f32[256,256]) {
  %h = Add(%x, %r)
  %y = RMSNorm(%h, %w) {epsilon = 0.00001}
  %m = MatMul(%y, %wm)
  %out = Add(%m, %h)
  return %out
})";

TEST(FuseRowwise, ResidualAddRmsNormAlsoEmitsTheSum) {
  auto g = Parse(kResidualRmsNorm);
  const std::string add = g->FindValue("h")->producer()->name();
  const std::string norm = g->FindValue("y")->producer()->name();
  FusionReport r = Plan(*g);
  ASSERT_EQ(CountOp(*g, "FusedNorm"), 1) << PrintGraph(*g);
  const Node* f = FindOp(*g, "FusedNorm");
  ASSERT_EQ(f->outputs().size(), 2u);
  EXPECT_EQ(f->output(0)->name(), "y");
  EXPECT_EQ(f->output(1)->name(), "h");  // the residual stream, for the add after the MLP
  EXPECT_EQ(f->inputs().size(), 3u);     // x, r, w
  EXPECT_EQ(f->GetString("norm", ""), "RMSNorm");
  EXPECT_FLOAT_EQ(f->GetFloat("epsilon", 0), 1e-5f);
  EXPECT_EQ(f->GetString("kernel_name", "").rfind("rmsnorm_prologue_add_f32_", 0), 0u) << f->GetString("kernel_name", "");
  EXPECT_EQ(f->GetString("kernel_name", "").size(), std::string("rmsnorm_prologue_add_f32_").size() + 8);
  const Graph* ref = f->GetGraph("reference");
  ASSERT_NE(ref, nullptr);
  EXPECT_EQ(ref->inputs().size(), f->inputs().size());
  EXPECT_EQ(ref->outputs().size(), f->outputs().size());
  const FusedGroupInfo* grp = FindGroup(r, "norm");
  ASSERT_NE(grp, nullptr);
  EXPECT_EQ(grp->name, "fused_norm_0");
  EXPECT_EQ(grp->nodes, (std::vector<std::string>{add, norm}));
  // The elementwise planner's refusal between the add and the norm no longer holds.
  for (const auto& x : r.refusals) EXPECT_FALSE(x.producer == add && x.consumer == norm) << x.code;
  EXPECT_EQ(r.kernels_after, 3);  // FusedNorm, MatMul, Add
}

TEST(FuseRowwise, LayerNormWithBiasAndResidualPrologue) {
  auto g = Parse(R"(graph @ln(%a: f32[4,32,384], %b: f32[384], %res: f32[4,32,384], %g: f32[384], %beta: f32[384]) {
  %0 = Add(%a, %b)
  %h = Add(%0, %res)
  %y = LayerNormalization(%h, %g, %beta) {axis = -1, epsilon = 0.00001}
  return %y
})");
  FusionReport r = Plan(*g);
  EXPECT_EQ(g->num_nodes(), 1u) << PrintGraph(*g);
  const Node* f = FindOp(*g, "FusedNorm");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->outputs().size(), 1u);  // the sum is read by the norm only
  EXPECT_EQ(f->GetString("norm", ""), "LayerNormalization");
  EXPECT_EQ(f->GetString("kernel_name", "").rfind("layernorm_prologue_add_add_f32_", 0), 0u);
  ASSERT_EQ(r.groups.size(), 1u);  // the elementwise group fused_0 was absorbed
  EXPECT_EQ(r.groups[0].kind, "norm");
  EXPECT_EQ(r.groups[0].nodes.size(), 3u);
  EXPECT_EQ(r.kernels_after, 1);
}

constexpr const char* kAttention = R"(graph @attn(%qk: f32[2,4,64,80], %mask: f32[2,1,64,80], %keep: f32[2,4,64,80]) {
  %c: f32[] = const [0.125]
  %0 = Mul(%qk, %c)
  %1 = Add(%0, %mask)
  %a = Softmax(%1) {axis = -1}
  %p = Mul(%a, %keep)
  return %p
})";

TEST(FuseRowwise, SoftmaxWithScaleMaskPrologueAndDropoutEpilogue) {
  auto g = Parse(kAttention);
  FusionReport r = Plan(*g);
  EXPECT_EQ(g->num_nodes(), 1u) << PrintGraph(*g);
  const Node* f = FindOp(*g, "FusedSoftmax");
  ASSERT_NE(f, nullptr);
  ASSERT_NE(f->GetGraph("prologue"), nullptr);
  ASSERT_NE(f->GetGraph("epilogue"), nullptr);
  EXPECT_EQ(f->outputs().size(), 1u);
  EXPECT_EQ(f->output(0)->name(), "p");
  EXPECT_EQ(f->GetString("kernel_name", "").rfind("softmax_prologue_mul_add_epilogue_mul_f32_", 0), 0u)
      << f->GetString("kernel_name", "");
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_EQ(r.groups[0].name, "fused_softmax_0");
  EXPECT_EQ(r.groups[0].kind, "softmax");
  EXPECT_EQ(r.groups[0].nodes.size(), 4u);  // Mul, Add, Softmax, Mul
  EXPECT_EQ(r.kernels_after, 1);
}

TEST(FuseRowwise, SoftmaxReadByTwoNodesKeepsItsPrologueOnly) {
  auto g = Parse(R"(graph @s(%x: f32[8,128], %b: f32[128], %keep: f32[8,128]) {
  %0 = Add(%x, %b)
  %a = Softmax(%0)
  %p = Mul(%a, %keep)
  return %p, %a
})");
  FusionReport r = Plan(*g);
  const Node* f = FindOp(*g, "FusedSoftmax");
  ASSERT_NE(f, nullptr) << PrintGraph(*g);
  EXPECT_EQ(f->GetGraph("epilogue"), nullptr);
  EXPECT_NE(f->GetGraph("prologue"), nullptr);
  EXPECT_NE(FindRefusal(r, "rowwise-softmax-output-shared"), nullptr);
  EXPECT_EQ(CountOp(*g, "Mul"), 1);
}

// ---- refusals ----

TEST(FuseRowwise, RefusesNormOverMoreThanTheLastAxis) {
  auto g = Parse(R"(graph @ln(%a: f32[4,8,32], %r: f32[4,8,32], %g: f32[8,32]) {
  %h = Add(%a, %r)
  %y = LayerNormalization(%h, %g) {axis = 1}
  return %y
})");
  FusionReport r = Plan(*g);
  EXPECT_EQ(CountOp(*g, "FusedNorm"), 0);
  const FusionRefusal* x = FindRefusal(r, "rowwise-axis-not-last");
  ASSERT_NE(x, nullptr);
  EXPECT_NE(x->message.find("f32[4,8,32]"), std::string::npos) << x->message;
  EXPECT_NE(x->message.find("LayerNormalization"), std::string::npos) << x->message;
}

TEST(FuseRowwise, RefusesSoftmaxOverAnotherAxis) {
  auto g = Parse(R"(graph @s(%x: f32[8,128], %b: f32[128]) {
  %0 = Add(%x, %b)
  %a = Softmax(%0) {axis = 0}
  return %a
})");
  FusionReport r = Plan(*g);
  EXPECT_EQ(CountOp(*g, "FusedSoftmax"), 0);
  EXPECT_NE(FindRefusal(r, "rowwise-axis-not-last"), nullptr);
}

TEST(FuseRowwise, RefusesEpilogueThatBroadcastsTheRowsWider) {
  // Add reads the probabilities [4,64,64] and writes [2,4,64,64]: its iteration space is not the
  // softmax's rows.
  auto g = Parse(R"(graph @s(%x: f32[4,64,64], %t: f32[2,4,64,64]) {
  %a = Softmax(%x)
  %p = Add(%a, %t)
  return %p
})");
  FusionReport r = Plan(*g);
  EXPECT_EQ(CountOp(*g, "FusedSoftmax"), 0) << PrintGraph(*g);
  const FusionRefusal* x = FindRefusal(r, "rowwise-broadcast-expansion");
  ASSERT_NE(x, nullptr);
  EXPECT_NE(x->message.find("[2,4,64,64]"), std::string::npos) << x->message;
  EXPECT_NE(x->message.find("[4,64,64]"), std::string::npos) << x->message;
}

TEST(FuseRowwise, RefusesExcludedProducerAndExcludedGroup) {
  {
    auto g = Parse(kResidualRmsNorm);
    FusionOptions o;
    o.exclude = {g->FindValue("h")->producer()->name()};
    FusionReport r = Plan(*g, o);
    EXPECT_EQ(CountOp(*g, "FusedNorm"), 0);
    const std::string add = *o.exclude.begin(), norm = g->FindValue("y")->producer()->name();
    bool refused = false;  // the elementwise planner also refuses the add's other merges
    for (const auto& x : r.refusals)
      refused |= x.code == refusal::kExcluded && x.producer == add && x.consumer == norm;
    EXPECT_TRUE(refused);
  }
  {
    auto g = Parse(kResidualRmsNorm);
    FusionOptions o;
    o.exclude = {"fused_norm_0"};
    FusionReport r = Plan(*g, o);
    EXPECT_EQ(CountOp(*g, "FusedNorm"), 0);
    const FusionRefusal* x = FindRefusal(r, refusal::kExcluded);
    ASSERT_NE(x, nullptr);
    EXPECT_EQ(x->consumer, g->FindValue("y")->producer()->name());
    EXPECT_NE(x->message.find("fused_norm_0"), std::string::npos) << x->message;
  }
}

TEST(FuseRowwise, RefusesScaleComputedFromThePrologue) {
  auto g = Parse(R"(graph @c(%x: f32[4,64], %r: f32[4,64]) {
  %h = Add(%x, %r)
  %s = ReduceMean(%h) {axes = [0], keepdims = 0}
  %y = RMSNorm(%h, %s)
  return %y
})");
  FusionReport r = Plan(*g);
  EXPECT_EQ(CountOp(*g, "FusedNorm"), 0);
  EXPECT_NE(FindRefusal(r, refusal::kWouldCreateCycle), nullptr);
}

// f16 rows fuse only where the target's row kernels take them (FusionOptions::narrow_row_kernels).
TEST(FuseRowwise, NarrowRowsFuseOnlyWhereTheTargetTakesThem) {
  constexpr char kIr[] = R"(graph @h(%x: f16[4,64], %r: f16[4,64], %w: f16[64]) {
  %h = Add(%x, %r)
  %y = RMSNorm(%h, %w)
  return %y
})";
  auto g = Parse(kIr);
  FusionOptions f32_only;
  f32_only.narrow_row_kernels = false;
  FusionReport r = Plan(*g, f32_only);
  EXPECT_EQ(CountOp(*g, "FusedNorm"), 0);
  EXPECT_NE(FindRefusal(r, "rowwise-dtype-unsupported"), nullptr);

  auto narrow = Parse(kIr);
  r = Plan(*narrow);
  ASSERT_EQ(CountOp(*narrow, "FusedNorm"), 1) << PrintGraph(*narrow);
  EXPECT_EQ(FindRefusal(r, "rowwise-dtype-unsupported"), nullptr);
  EXPECT_EQ(narrow->outputs()[0]->dtype(), DType::kF16);
}

TEST(FuseRowwise, DisabledChangesNothing) {
  auto g = Parse(kAttention);
  const std::string before = PrintGraph(*g);
  FusionOptions o;
  o.enabled = false;
  FusionReport r;
  auto formed = FuseRowwise(*g, o, &r);
  ASSERT_TRUE(formed.ok());
  EXPECT_EQ(*formed, 0);
  EXPECT_EQ(PrintGraph(*g), before);
  EXPECT_TRUE(r.groups.empty() && r.refusals.empty());
}

// ---- numbers ----

TEST(FuseRowwiseNumerics, ResidualRmsNormWithTwoOpPrologue) {
  std::unique_ptr<Graph> fused;
  std::vector<Tensor> out, in;
  FusionReport r = CompareFusedUnfused(R"(graph @block(%x: f32[64,1000], %r: f32[64,1000], %g: f32[1000], %w: f32[1000], %wm: f32[1000,64]) {
  %0 = Add(%x, %r)
  %h = Mul(%0, %g)
  %y = RMSNorm(%h, %w) {epsilon = 0.00001}
  %m = MatMul(%y, %wm)
  return %m, %h, %y
})", &fused, &out, &in);
  ASSERT_EQ(CountOp(*fused, "FusedNorm"), 1) << PrintGraph(*fused);
  ASSERT_EQ(out.size(), 3u);
  // float64: h = (x + r) * g, y = h / sqrt(mean(h^2) + eps) * w.
  const int64_t rows = 64, d = 1000;
  double worst = 0;
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<double> h(d);
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) {
      h[j] = (in[0].GetAsDouble(i * d + j) + in[1].GetAsDouble(i * d + j)) * in[2].GetAsDouble(j);
      ss += h[j] * h[j];
    }
    const double inv = 1 / std::sqrt(ss / d + 1e-5);
    for (int64_t j = 0; j < d; ++j) {
      const double want = h[j] * inv * in[3].GetAsDouble(j), got = out[2].GetAsDouble(i * d + j);
      // f32 rounds h twice (add, mul: 1 ulp), then * inv * w (2 more roundings, inv itself 1):
      // about 5 ulp of |y| in all; atol covers results near 0 (|y| up to ~8 here).
      EXPECT_NEAR(got, want, 6e-7 * std::fabs(want) + 1e-7) << "row " << i << " col " << j;
      worst = std::max(worst, std::fabs(got - want));
    }
  }
  EXPECT_LT(worst, 1e-5);
  EXPECT_EQ(r.kernels_after, 2);  // FusedNorm, MatMul
}

TEST(FuseRowwiseNumerics, LayerNormWithBiasResidualPrologue) {
  std::unique_ptr<Graph> fused;
  std::vector<Tensor> out, in;
  CompareFusedUnfused(R"(graph @ln(%a: f32[3,40,768], %b: f32[768], %res: f32[3,40,768], %g: f32[768], %beta: f32[768]) {
  %0 = Add(%a, %b)
  %h = Add(%0, %res)
  %y = LayerNormalization(%h, %g, %beta) {epsilon = 0.00001}
  return %y
})", &fused, &out, &in);
  ASSERT_EQ(CountOp(*fused, "FusedNorm"), 1) << PrintGraph(*fused);
  const int64_t rows = 120, d = 768;
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<double> h(d);
    double mean = 0, var = 0;
    for (int64_t j = 0; j < d; ++j) {
      h[j] = in[0].GetAsDouble(i * d + j) + in[1].GetAsDouble(j) + in[2].GetAsDouble(i * d + j);
      mean += h[j];
    }
    mean /= d;
    for (int64_t j = 0; j < d; ++j) var += (h[j] - mean) * (h[j] - mean);
    const double inv = 1 / std::sqrt(var / d + 1e-5);
    for (int64_t j = 0; j < d; ++j) {
      const double want = (h[j] - mean) * inv * in[3].GetAsDouble(j) + in[4].GetAsDouble(j);
      // h - mean cancels: its f32 error is ~2 ulp of |h| (|h| <= 6), i.e. ~1e-6 absolute
      // before the (|scale| <= 2) * inv (~0.8) factor.
      EXPECT_NEAR(out[0].GetAsDouble(i * d + j), want, 2e-6 * std::fabs(want) + 4e-6) << "row " << i << " col " << j;
    }
  }
}

TEST(FuseRowwiseNumerics, SoftmaxScaleMaskDropoutMask) {
  std::unique_ptr<Graph> fused;
  std::vector<Tensor> out, in;
  CompareFusedUnfused(kAttention, &fused, &out, &in);
  ASSERT_EQ(CountOp(*fused, "FusedSoftmax"), 1) << PrintGraph(*fused);
  const int64_t b = 2, h = 4, s = 64, n = 80;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hi = 0; hi < h; ++hi)
      for (int64_t si = 0; si < s; ++si) {
        const int64_t row = ((bi * h + hi) * s + si) * n, mrow = (bi * s + si) * n;
        std::vector<double> z(n);
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          z[j] = in[0].GetAsDouble(row + j) * 0.125 + in[1].GetAsDouble(mrow + j);
          m = std::max(m, z[j]);
        }
        for (int64_t j = 0; j < n; ++j) sum += std::exp(z[j] - m);
        for (int64_t j = 0; j < n; ++j) {
          const double want = std::exp(z[j] - m) / sum * in[2].GetAsDouble(row + j);
          // f32 rounds qk*c + mask (|z| <= 0.25 where unmasked: 2^-25 absolute), z - m the same,
          // exp is 1 ulp, the 1/sum and the two products 1.5 ulp: ~4 ulp relative in all.
          EXPECT_NEAR(out[0].GetAsDouble(row + j), want, 6e-7 * std::fabs(want) + 1e-9) << row + j;
        }
      }
}

// --check-fusion runs each fused node's "reference" graph on the node's own inputs: it must
// give the node's outputs.
TEST(FuseRowwiseNumerics, ReferenceGraphsReproduceTheFusedNodes) {
  auto g = Parse(R"(graph @both(%x: f32[8,4,96], %r: f32[8,4,96], %w: f32[96], %mask: f32[8,1,96], %keep: f32[8,4,96]) {
  %h = Add(%x, %r)
  %y = RMSNorm(%h, %w)
  %c: f32[] = const [0.5]
  %0 = Mul(%y, %c)
  %1 = Add(%0, %mask)
  %a = Softmax(%1)
  %p = Mul(%a, %keep)
  %o = Add(%p, %h)
  return %o
})");
  PipelineOptions on;
  ASSERT_TRUE(RunPipeline(*g, cpu::DefaultCpuTarget(), on).ok());
  ASSERT_EQ(CountOp(*g, "FusedNorm"), 1) << PrintGraph(*g);
  ASSERT_EQ(CountOp(*g, "FusedSoftmax"), 1) << PrintGraph(*g);
  auto plan = ExecutionPlan::Compile(*g);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::vector<Tensor> ins = RowwiseInputs(*g, 5);
  ThreadPool pool(2);
  int checked = 0;
  ExecutionPlan::StepObserver observer = [&](const Node& n, std::span<const TensorView> in,
                                              std::span<const TensorView> out) -> Status {
    const Graph* ref = n.GetGraph("reference");
    if (!ref) return Status::Ok();
    EXPECT_EQ(ref->inputs().size(), in.size()) << n.name();
    EXPECT_EQ(ref->outputs().size(), out.size()) << n.name();
    GF_ASSIGN_OR_RETURN(std::vector<Tensor> want, Execute(*ref, in, CpuContext{}));
    for (size_t k = 0; k < want.size() && k < out.size(); ++k) {
      Tensor got = Tensor::Empty(out[k].dtype, out[k].shape).value();
      std::memcpy(got.data(), out[k].data, got.nbytes());
      ExpectClose(got, want[k], kFusedRtol, kFusedAtol, StrCat(n.name(), " output ", k));
    }
    ++checked;
    return Status::Ok();
  };
  std::vector<Tensor> outputs;
  for (const Value* v : g->outputs()) outputs.push_back(Tensor::Empty(v->dtype(), v->shape()).value());
  std::vector<TensorView> out_views = Views(outputs);
  ASSERT_TRUE((*plan)->Run(Views(ins), out_views, CpuContext{&pool}, &observer).ok());
  EXPECT_EQ(checked, 2);
}

}  // namespace
}  // namespace graphfuse
