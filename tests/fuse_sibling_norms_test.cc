// FuseSiblingNorms (fuse_sibling_norms.cc) and its kernel FusedLayerNorms (cpu/kernels/norm.cc):
// the norms of one input become one node; the fused plan gives the unfused plan's bits, and both
// agree with LayerNorm computed here in float64; norms that differ, or whose statistics are
// read, stay apart with a refusal by code; the node's reference graph computes what it does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "cpu/cpu_target.h"
#include "cpu/executor.h"
#include "graph_test_util.h"
#include "ir/text.h"
#include "passes/pipeline.h"

namespace graphfuse {
namespace {

FusionReport Plan(Graph& g, bool fused) {
  FusionReport report;
  PipelineOptions o;
  o.fusion.enabled = fused;
  o.fusion_report = &report;
  auto r = RunPipeline(g, cpu::DefaultCpuTarget(), o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return report;
}

std::vector<Tensor> RunOnCpu(const Graph& g, std::span<const TensorView> ins) {
  ThreadPool pool(3);
  CpuContext ctx{&pool};
  ctx.min_work_per_thread = 256;  // several threads even for these small tensors
  auto out = Execute(g, ins, ctx);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? std::move(*out) : std::vector<Tensor>{};
}
std::vector<Tensor> RunOnCpu(const Graph& g, const std::vector<Tensor>& ins) { return RunOnCpu(g, Views(ins)); }

// A parallel block's two norms of the residual stream, read by its attention and its MLP (here:
// a Tanh and a Sigmoid, which run as kernels of their own: a norm takes no epilogue).
std::string ParallelBlock(const std::string& dtype, const std::string& eps2 = "0.00001") {
  return StrCat("graph @parallel(%x: ", dtype, "[3,5,64], %g1: ", dtype, "[64], %b1: ", dtype, "[64], %g2: ", dtype,
                "[64], %b2: ", dtype, R"([64]) {
  %a = LayerNormalization(%x, %g1, %b1) {axis = -1, epsilon = 0.00001}
  %m = LayerNormalization(%x, %g2, %b2) {axis = -1, epsilon = )", eps2, R"(}
  %pa = Tanh(%a)
  %pm = Sigmoid(%m)
  return %pa, %pm, %a, %m
})");
}

// Inputs whose rows have a mean far from 0 (x = 3 + noise), as a residual stream may: the
// two-pass variance must hold.
std::vector<Tensor> Inputs(const Graph& g, uint32_t seed) {
  return RandomInputs(g, seed, 0.05, 2.0, [](const Value& v, int64_t, std::mt19937& rng) -> std::optional<double> {
    if (v.name() != "x") return std::nullopt;
    return 3.0 + static_cast<double>(rng() % 2001) / 1000.0 - 1.0;
  });
}

// LayerNorm of row r of x over its last dim, in float64.
double LayerNormAt(const Tensor& x, const Tensor& g, const Tensor& b, int64_t row, int64_t j, int64_t d) {
  double mean = 0, var = 0;
  for (int64_t k = 0; k < d; ++k) mean += x.GetAsDouble(row * d + k);
  mean /= static_cast<double>(d);
  for (int64_t k = 0; k < d; ++k) var += (x.GetAsDouble(row * d + k) - mean) * (x.GetAsDouble(row * d + k) - mean);
  var /= static_cast<double>(d);
  return (x.GetAsDouble(row * d + j) - mean) / std::sqrt(var + 1e-5) * g.GetAsDouble(j) + b.GetAsDouble(j);
}

TEST(FuseSiblingNorms, TheTwoNormsOfAParallelBlockAreOneKernelWithTheSameBits) {
  for (const std::string dtype : {"f32", "bf16"}) {
    SCOPED_TRACE(dtype);
    auto unfused = Parse(ParallelBlock(dtype)), fused = Parse(ParallelBlock(dtype));
    const FusionReport off = Plan(*unfused, false);
    const FusionReport on = Plan(*fused, true);
    ASSERT_EQ(CountOp(*fused, "FusedLayerNorms"), 1) << PrintGraph(*fused);
    EXPECT_EQ(CountOp(*fused, "LayerNormalization"), 0);
    EXPECT_EQ(CountKernels(*fused), CountKernels(*unfused) - 1);
    const Node* n = FindOp(*fused, "FusedLayerNorms");
    EXPECT_EQ(n->GetInt("norms", 0), 2);
    EXPECT_EQ(n->GetInt("with_bias", 0), 1);
    EXPECT_EQ(n->output(0)->name(), "a");  // the norms' names stay
    EXPECT_EQ(n->output(1)->name(), "m");
    const FusedGroupInfo* gi = FindGroup(on, "norm");
    ASSERT_NE(gi, nullptr);
    EXPECT_EQ(gi->nodes.size(), 2u);
    EXPECT_EQ(gi->kernel_name.rfind(StrCat("layernorm_x2_", dtype, "_"), 0), 0u) << gi->kernel_name;

    const std::vector<Tensor> ins = Inputs(*unfused, 5);
    const std::vector<Tensor> want = RunOnCpu(*unfused, ins), got = RunOnCpu(*fused, ins);
    ASSERT_EQ(want.size(), 4u);
    ASSERT_EQ(got.size(), 4u);
    for (size_t k = 0; k < 4; ++k)
      EXPECT_EQ(std::memcmp(got[k].data(), want[k].data(), want[k].nbytes()), 0) << "output " << k;
    // Against float64: f32 within 1e-5 relative to the row's scale; bf16 within its rounding.
    const double tol = dtype == "f32" ? 2e-5 : 2e-2;
    for (size_t k = 2; k < 4; ++k) {
      const Tensor &g = ins[k == 2 ? 1 : 3], &b = ins[k == 2 ? 2 : 4];
      double worst = 0;
      for (int64_t row = 0; row < 15; ++row)
        for (int64_t j = 0; j < 64; ++j) {
          const double ref = LayerNormAt(ins[0], g, b, row, j, 64);
          worst = std::max(worst, std::fabs(got[k].GetAsDouble(row * 64 + j) - ref) / (1 + std::fabs(ref)));
        }
      EXPECT_LT(worst, tol) << "output " << k;
    }
  }
}

TEST(FuseSiblingNorms, TheReferenceGraphComputesWhatTheNodeComputes) {
  auto g = Parse(ParallelBlock("f32"));
  Plan(*g, true);
  const Node* n = FindOp(*g, "FusedLayerNorms");
  ASSERT_NE(n, nullptr);
  const Graph* ref = n->GetGraph("reference");
  ASSERT_NE(ref, nullptr);
  ASSERT_EQ(ref->inputs().size(), n->inputs().size());
  ASSERT_EQ(ref->outputs().size(), 2u);
  const std::vector<Tensor> ins = Inputs(*g, 9);
  std::vector<TensorView> node_ins;  // the node's inputs are graph inputs here
  for (const Value* v : n->inputs()) {
    const auto at = std::find(g->inputs().begin(), g->inputs().end(), v);
    ASSERT_NE(at, g->inputs().end()) << v->name();
    node_ins.push_back(ins[static_cast<size_t>(at - g->inputs().begin())].view());
  }
  const std::vector<Tensor> from_ref = RunOnCpu(*ref, node_ins), from_graph = RunOnCpu(*g, ins);
  ASSERT_EQ(from_ref.size(), 2u);
  ASSERT_EQ(from_graph.size(), 4u);
  EXPECT_EQ(std::memcmp(from_ref[0].data(), from_graph[2].data(), from_ref[0].nbytes()), 0);
  EXPECT_EQ(std::memcmp(from_ref[1].data(), from_graph[3].data(), from_ref[1].nbytes()), 0);
}

TEST(FuseSiblingNorms, NormsWithAnotherEpsilonStayApart) {
  auto g = Parse(ParallelBlock("f32", "0.000001"));
  const FusionReport r = Plan(*g, true);
  EXPECT_EQ(CountOp(*g, "FusedLayerNorms"), 0) << PrintGraph(*g);
  EXPECT_EQ(CountOp(*g, "LayerNormalization"), 2);
  const FusionRefusal* why = FindRefusal(r, "sibling-norms-differ");
  ASSERT_NE(why, nullptr);
  EXPECT_NE(why->message.find("epsilon"), std::string::npos) << why->message;
}

TEST(FuseSiblingNorms, ThreeNormsOneDifferentTheOtherTwoFuse) {
  auto g = Parse(R"(graph @three(%x: f32[4,32], %g: f32[32], %b: f32[32]) {
  %a = LayerNormalization(%x, %g, %b) {epsilon = 0.00001}
  %c = LayerNormalization(%x, %g) {epsilon = 0.00001}
  %d = LayerNormalization(%x, %b, %g) {epsilon = 0.00001}
  return %a, %c, %d
})");
  const FusionReport r = Plan(*g, true);
  ASSERT_EQ(CountOp(*g, "FusedLayerNorms"), 1) << PrintGraph(*g);
  EXPECT_EQ(CountOp(*g, "LayerNormalization"), 1);  // %c: no bias where %a has one
  const FusionRefusal* why = FindRefusal(r, "sibling-norms-differ");
  ASSERT_NE(why, nullptr);
  EXPECT_NE(why->message.find("no bias"), std::string::npos) << why->message;
}

TEST(FuseSiblingNorms, ANormWhoseMeanIsReadStaysAlone) {
  auto g = Parse(R"(graph @stats(%x: f32[4,32], %g: f32[32], %b: f32[32]) {
  %a = LayerNormalization(%x, %g, %b) {epsilon = 0.00001}
  %m, %mean = LayerNormalization(%x, %b, %g) {epsilon = 0.00001}
  return %a, %m, %mean
})");
  const FusionReport r = Plan(*g, true);
  EXPECT_EQ(CountOp(*g, "FusedLayerNorms"), 0) << PrintGraph(*g);
  ASSERT_NE(FindRefusal(r, "sibling-norm-statistics-used"), nullptr);
}

TEST(FuseSiblingNorms, ExcludedNormsStayKernels) {
  auto g = Parse(ParallelBlock("f32"));
  const std::string a = g->FindValue("a")->producer()->name();
  FusionReport report;
  PipelineOptions o;
  o.fusion.exclude = {a};
  o.fusion_report = &report;
  ASSERT_TRUE(RunPipeline(*g, cpu::DefaultCpuTarget(), o).ok());
  EXPECT_EQ(CountOp(*g, "FusedLayerNorms"), 0);
  ASSERT_NE(FindRefusal(report, "excluded"), nullptr);
}

}  // namespace
}  // namespace graphfuse
