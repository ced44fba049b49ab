// FuseGemm: horizontal GEMMs and GEMM epilogues. Graphs are built with the C++ API (random
// constant weights); every fused graph is run against the same graph unfused on fresh random
// inputs, and one case against a float64 computation written out here.
#include <gtest/gtest.h>

#include "cpu/cpu_target.h"
#include "graph_test_util.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>

#include "graphfuse/thread_pool.h"
#include "passes/gemm_epilogue_form.h"
#include "passes/fusion_passes.h"
#include "passes/pipeline.h"
#include "cpu/executor.h"

namespace graphfuse {
namespace {

std::shared_ptr<Tensor> RandomTensor(const Shape& s, uint32_t seed, double scale = 1.0) {
  auto t = std::make_shared<Tensor>(Tensor::Empty(DType::kF32, s).value());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < t->numel(); ++i) t->data_as<float>()[i] = static_cast<float>(u(rng) * scale);
  return t;
}

using Builder = std::function<void(Graph&)>;

struct PlanRun {
  FusionReport report;
  std::unique_ptr<Graph> graph;
  std::vector<Tensor> outputs;
  std::vector<Tensor> inputs;
};

// Builds the graph twice, runs it unfused and through the whole pipeline, on the same inputs.
std::pair<PlanRun, PlanRun> BuildAndRun(const Builder& build, FusionOptions options = {}) {
  PlanRun unfused, fused;
  unfused.graph = std::make_unique<Graph>();
  fused.graph = std::make_unique<Graph>();
  build(*unfused.graph);
  build(*fused.graph);
  PipelineOptions off;
  off.fusion.enabled = false;
  off.fusion_report = &unfused.report;
  EXPECT_TRUE(RunPipeline(*unfused.graph, cpu::DefaultCpuTarget(), off).ok());
  PipelineOptions on;
  on.fusion = options;
  on.fusion_report = &fused.report;
  auto passes = RunPipeline(*fused.graph, cpu::DefaultCpuTarget(), on);
  EXPECT_TRUE(passes.ok()) << passes.status().ToString();
  uint32_t seed = 100;
  for (const Value* v : unfused.graph->inputs()) {
    unfused.inputs.push_back(std::move(*RandomTensor(v->shape(), seed++)));
  }
  std::vector<TensorView> views;
  for (const Tensor& t : unfused.inputs) views.push_back(t.view());
  ThreadPool pool(2);
  auto a = Execute(*unfused.graph, views, CpuContext{&pool});
  auto b = Execute(*fused.graph, views, CpuContext{&pool});
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  if (a.ok()) unfused.outputs = std::move(*a);
  if (b.ok()) fused.outputs = std::move(*b);
  return {std::move(unfused), std::move(fused)};
}

// Fused and unfused run the same sgemm kernel on the same K-ordering per element, but the
// column blocking differs; allow a few ulp of the largest output magnitude.
void ExpectClose(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(a[k].numel(), b[k].numel());
    double peak = 0, worst = 0;
    int64_t nan_mismatches = 0;  // std::max would pass a NaN over: count them apart
    for (int64_t i = 0; i < a[k].numel(); ++i) {
      const double x = a[k].GetAsDouble(i), y = b[k].GetAsDouble(i);
      if (std::isnan(x) != std::isnan(y)) ++nan_mismatches;
      peak = std::max(peak, std::fabs(x));
      worst = std::max(worst, std::fabs(x - y));
    }
    EXPECT_EQ(nan_mismatches, 0) << "output " << k << ": NaN on one side only";
    EXPECT_GT(peak, 0.0) << "output " << k << " is all zeros: the test would prove nothing";
    EXPECT_LE(worst, 4 * 1.2e-7 * peak) << "output " << k;
  }
}

constexpr int64_t kM = 12, kK = 48, kN = 80;

TEST(FuseGemm, ProjectionsOfOneInputBecomeOneGemm) {
  auto [unfused, fused] = BuildAndRun([](Graph& g) {
    Value* x = g.AddInput("x", DType::kF32, {2, kM / 2, kK}).value();
    for (int s = 0; s < 3; ++s) {
      Value* w = g.AddConstant(StrCat("w", s), RandomTensor({kK, kN}, 10 + s)).value();
      Node* mm = g.AddNode("MatMul", {x, w}, {}, StrCat("proj", s)).value();
      ASSERT_TRUE(g.MarkOutput(mm->output()).ok());
    }
  });
  EXPECT_EQ(CountOp(*fused.graph, "FusedGemm"), 1);
  EXPECT_EQ(CountOp(*fused.graph, "MatMul"), 0);
  EXPECT_EQ(fused.report.kernels_before, 3);
  EXPECT_EQ(fused.report.kernels_after, 1);
  const FusedGroupInfo* g = FindGroup(fused.report, "gemm_horizontal");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->nodes, (std::vector<std::string>{"proj0", "proj1", "proj2"}));
  // Output names are kept.
  EXPECT_EQ(fused.graph->outputs()[1]->name(), unfused.graph->outputs()[1]->name());
  ExpectClose(unfused.outputs, fused.outputs);
}

// bf16 projections fuse as f32 ones do (the CUDA target runs them); the CPU, whose GEMMs are
// f32, refuses the plan when compiling, naming the node and the dtypes.
TEST(FuseGemm, Bf16ProjectionsFuseAndTheCpuRefusesThem) {
  Graph g("bf16");
  Value* x = g.AddInput("x", DType::kBF16, {kM, kK}).value();
  std::vector<Node*> mms;
  for (int s = 0; s < 2; ++s) {
    auto w = std::make_shared<Tensor>(Tensor::Empty(DType::kBF16, {kK, kN}).value());
    const std::shared_ptr<Tensor> wf = RandomTensor({kK, kN}, 20 + s);
    for (int64_t i = 0; i < w->numel(); ++i) w->data_as<uint16_t>()[i] = F32ToBF16Bits(wf->data_as<float>()[i]);
    Value* wv = g.AddConstant(StrCat("w", s), w).value();
    Node* mm = g.AddNode("MatMul", {x, wv}, {}, StrCat("proj", s)).value();
    ASSERT_TRUE(g.MarkOutput(mm->output()).ok());
  }
  auto piped = RunPipeline(g, cpu::DefaultCpuTarget());
  ASSERT_TRUE(piped.ok()) << piped.status().ToString();
  EXPECT_EQ(CountOp(g, "FusedGemm"), 1);
  for (const Value* o : g.outputs()) EXPECT_EQ(o->dtype(), DType::kBF16);
  auto plan = ExecutionPlan::Compile(g);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(plan.status().message().find("f32 GEMMs only, not bf16"), std::string::npos) << plan.status().ToString();
}

TEST(FuseGemm, SwigluRunsAsTheEpilogueOfTheGateUpGemm) {
  auto build = [](Graph& g) {
    Value* h = g.AddInput("h", DType::kF32, {kM, kK}).value();
    Value* wg = g.AddConstant("wg", RandomTensor({kK, kN}, 21)).value();
    Value* wu = g.AddConstant("wu", RandomTensor({kK, kN}, 22)).value();
    Value* gate = g.AddNode("MatMul", {h, wg}, {}, "gate").value()->output();
    Value* up = g.AddNode("MatMul", {h, wu}, {}, "up").value()->output();
    Value* act = g.AddNode("Silu", {gate}, {}, "silu").value()->output();
    Value* y = g.AddNode("Mul", {act, up}, {}, "mul").value()->output();
    ASSERT_TRUE(g.MarkOutput(y).ok());
  };
  auto [unfused, fused] = BuildAndRun(build);
  EXPECT_EQ(fused.report.kernels_after, 1);
  const FusedGroupInfo* g = FindGroup(fused.report, "gemm_epilogue");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->nodes, (std::vector<std::string>{"gate", "up", "silu", "mul"}));
  EXPECT_TRUE(fused.report.groups.size() == 1) << "the elementwise group is absorbed, not listed twice";
  ExpectClose(unfused.outputs, fused.outputs);

  // Against float64: y = silu(h Wg) * (h Wu).
  const Tensor& hx = unfused.inputs[0];
  Graph ref;
  build(ref);
  const Tensor& wg = *ref.FindValue("wg")->constant();
  const Tensor& wu = *ref.FindValue("wu")->constant();
  double worst = 0;
  for (int64_t i = 0; i < kM; ++i)
    for (int64_t j = 0; j < kN; ++j) {
      double a = 0, b = 0;
      for (int64_t k = 0; k < kK; ++k) {
        a += hx.GetAsDouble(i * kK + k) * wg.GetAsDouble(k * kN + j);
        b += hx.GetAsDouble(i * kK + k) * wu.GetAsDouble(k * kN + j);
      }
      const double want = a / (1 + std::exp(-a)) * b;
      const double err = std::fabs(want - fused.outputs[0].GetAsDouble(i * kN + j)) / (1 + std::fabs(want));
      if (!(err <= worst)) worst = err;  // a NaN sticks (std::max would pass over it)
    }
  EXPECT_LT(worst, 2e-5);  // f32 dot products of length 48 of values in [-1, 1]
}

TEST(FuseGemm, BiasAndResidualEpilogueKeepsTheSumForLaterReaders) {
  auto [unfused, fused] = BuildAndRun([](Graph& g) {
    Value* x = g.AddInput("x", DType::kF32, {kM, kK}).value();
    Value* r = g.AddInput("r", DType::kF32, {kM, kN}).value();
    Value* w = g.AddConstant("w", RandomTensor({kK, kN}, 31)).value();
    Value* b = g.AddConstant("b", RandomTensor({kN}, 32)).value();
    Value* y = g.AddNode("MatMul", {x, w}, {}, "proj").value()->output();
    Value* yb = g.AddNode("Add", {y, b}, {}, "bias").value()->output();
    Value* sum = g.AddNode("Add", {yb, r}, {}, "residual").value()->output();
    // The residual stream is read again by a non-elementwise op and is a graph output.
    Value* norm = g.AddNode("RMSNorm", {sum}, {{"epsilon", 1e-5f}}, "norm").value()->output();
    ASSERT_TRUE(g.MarkOutput(norm).ok());
    ASSERT_TRUE(g.MarkOutput(sum).ok());
  });
  EXPECT_EQ(CountOp(*fused.graph, "FusedGemm"), 1);
  EXPECT_EQ(fused.report.kernels_after, 2);  // the GEMM with its epilogue, the norm
  ExpectClose(unfused.outputs, fused.outputs);
}

TEST(FuseGemm, ReaderThatAlsoDependsOnTheGemmThroughAnotherOpIsRefused) {
  auto [unfused, fused] = BuildAndRun([](Graph& g) {
    Value* x = g.AddInput("x", DType::kF32, {kM, kK}).value();
    Value* w = g.AddConstant("w", RandomTensor({kK, kN}, 41)).value();
    Value* y = g.AddNode("MatMul", {x, w}, {}, "proj").value()->output();
    Value* s = g.AddNode("Softmax", {y}, {{"axis", int64_t{-1}}}, "softmax").value()->output();
    Value* z = g.AddNode("Add", {y, s}, {}, "add").value()->output();
    ASSERT_TRUE(g.MarkOutput(z).ok());
  });
  EXPECT_EQ(CountOp(*fused.graph, "FusedGemm"), 0);
  bool refused = false;
  for (const auto& r : fused.report.refusals)
    refused |= r.code == std::string(refusal::kWouldCreateCycle) && r.consumer == "add";
  EXPECT_TRUE(refused);
  ExpectClose(unfused.outputs, fused.outputs);
}

TEST(FuseGemm, ExcludedReaderStaysOutAndNonConstantWeightsAreNotFused) {
  FusionOptions o;
  o.exclude = {"relu"};
  auto [unfused, fused] = BuildAndRun(
      [](Graph& g) {
        Value* x = g.AddInput("x", DType::kF32, {kM, kK}).value();
        Value* wdyn = g.AddInput("wdyn", DType::kF32, {kK, kN}).value();
        Value* w = g.AddConstant("w", RandomTensor({kK, kN}, 51)).value();
        Value* y = g.AddNode("MatMul", {x, w}, {}, "proj").value()->output();
        Value* z = g.AddNode("Relu", {y}, {}, "relu").value()->output();
        Value* d = g.AddNode("MatMul", {x, wdyn}, {}, "dynamic").value()->output();
        Value* e = g.AddNode("Tanh", {d}, {}, "tanh").value()->output();
        ASSERT_TRUE(g.MarkOutput(z).ok());
        ASSERT_TRUE(g.MarkOutput(e).ok());
      },
      o);
  EXPECT_EQ(CountOp(*fused.graph, "FusedGemm"), 0);
  EXPECT_EQ(CountOp(*fused.graph, "MatMul"), 2);
  ExpectClose(unfused.outputs, fused.outputs);
}

TEST(FuseGemm, LinearLayerWrittenAsGemmGetsItsBiasAndActivationAsEpilogue) {
  auto [unfused, fused] = BuildAndRun([](Graph& g) {
    Value* x = g.AddInput("x", DType::kF32, {kM, kK}).value();
    Value* w = g.AddConstant("w", RandomTensor({kN, kK}, 71)).value();  // [out, in]: transB = 1
    Value* b = g.AddConstant("b", RandomTensor({kN}, 72)).value();
    Value* y = g.AddNode("Gemm", {x, w, b}, {{"transB", int64_t{1}}}, "linear").value()->output();
    Value* z = g.AddNode("Relu", {y}, {}, "relu").value()->output();
    ASSERT_TRUE(g.MarkOutput(z).ok());
  });
  EXPECT_EQ(CountOp(*fused.graph, "Gemm"), 0);
  EXPECT_EQ(fused.report.kernels_after, 1);
  const FusedGroupInfo* g = FindGroup(fused.report, "gemm_epilogue");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->nodes, (std::vector<std::string>{"linear", "linear/bias", "relu"}));
  ExpectClose(unfused.outputs, fused.outputs);
}

TEST(FuseGemm, GemmWithScaledProductIsLeftAlone) {
  auto [unfused, fused] = BuildAndRun([](Graph& g) {
    Value* x = g.AddInput("x", DType::kF32, {kM, kK}).value();
    Value* w = g.AddConstant("w", RandomTensor({kK, kN}, 81)).value();
    Value* y = g.AddNode("Gemm", {x, w}, {{"alpha", 0.5f}}, "scaled").value()->output();
    ASSERT_TRUE(g.MarkOutput(y).ok());
  });
  EXPECT_EQ(CountOp(*fused.graph, "Gemm"), 1);
  ExpectClose(unfused.outputs, fused.outputs);
}

// A compiled plan packs constant weights once; a one-off run (RunNodeOnce, constant folding)
// uses the unpacked sgemm path. Both must give the same results, for the fused
// GEMM with an epilogue and for a plain MatMul, with widths that leave a ragged last block.
TEST(FuseGemm, PackedWeightsGiveTheResultsOfTheUnpackedPath) {
  for (const int64_t n : {int64_t{80}, int64_t{1000}}) {
    auto [unfused, fused] = BuildAndRun([n](Graph& g) {
      Value* h = g.AddInput("h", DType::kF32, {kM, kK}).value();
      Value* wg = g.AddConstant("wg", RandomTensor({kK, n}, 91)).value();
      Value* wu = g.AddConstant("wu", RandomTensor({kK, n}, 92)).value();
      Value* gate = g.AddNode("MatMul", {h, wg}, {}, "gate").value()->output();
      Value* up = g.AddNode("MatMul", {h, wu}, {}, "up").value()->output();
      Value* y = g.AddNode("Mul", {g.AddNode("Silu", {gate}, {}, "silu").value()->output(), up}, {}, "mul")
                     .value()
                     ->output();
      ASSERT_TRUE(g.MarkOutput(y).ok());
    });
    ExpectClose(unfused.outputs, fused.outputs);  // both plans: packed weights
    ThreadPool pool(2);
    for (PlanRun* r : {&unfused, &fused}) {
      // Every GEMM node again, unpacked, on the inputs the plan gave it.
      std::map<const Value*, TensorView> value_of;
      value_of[r->graph->inputs()[0]] = unfused.inputs[0].view();  // the inputs both plans ran on
      std::vector<Tensor> keep;
      for (const auto& node : r->graph->nodes()) {
        std::vector<TensorView> in;
        for (const Value* v : node->inputs()) in.push_back(v->constant() ? v->constant()->view() : value_of.at(v));
        std::vector<TensorView> out;
        for (const Value* v : node->outputs()) {
          keep.push_back(Tensor::Empty(v->dtype(), v->shape()).value());
          out.push_back(keep.back().view());
          value_of[v] = keep.back().view();
        }
        ASSERT_TRUE(RunNodeOnce(*node, in, out, CpuContext{&pool}).ok()) << node->Describe();
      }
      std::vector<Tensor> once;
      const Value* y = r->graph->outputs()[0];
      once.push_back(Tensor::Empty(y->dtype(), y->shape()).value());
      std::memcpy(once[0].data(), value_of.at(y).data, once[0].nbytes());
      ExpectClose(once, r->outputs);
    }
  }
}

// The gated form out = U(p_act) * p_mul (SwiGLU, GeGLU, ...) runs per block of columns: p_act's
// GEMM, U in place, p_mul's GEMM multiplying as it stores (fused_gemm.cc). It must give the
// unfused plan's bits (MatMul, U, Mul one by one, on the same packed blocks) whichever
// projection U reads, in either operand order of the Mul, with ragged rows and a last block
// whose width is not a whole number of vectors (n = 84: blocks of 64 and 20 columns), and
// with K long enough for oneDNN to sum it in several chunks.
TEST(FuseGemm, GatedEpilogueGivesTheUnfusedBits) {
  struct Case {
    const char* op;
    bool act_first, act_left;
    int64_t m, n, k;
  };
  for (const Case& c : {Case{"Silu", true, true, kM, 84, 512}, Case{"Silu", false, false, 37, 1000, kK},
                        Case{"Gelu", true, false, 1, 84, kK}, Case{"Tanh", false, true, kM, 84, 512}}) {
    auto [unfused, fused] = BuildAndRun([&c](Graph& g) {
      Value* h = g.AddInput("h", DType::kF32, {c.m, c.k}).value();
      Value* wa = g.AddConstant("wa", RandomTensor({c.k, c.n}, 31)).value();
      Value* wm = g.AddConstant("wm", RandomTensor({c.k, c.n}, 32)).value();
      Value* pa = nullptr;
      Value* pm = nullptr;
      if (c.act_first) pa = g.AddNode("MatMul", {h, wa}, {}, "act_proj").value()->output();
      pm = g.AddNode("MatMul", {h, wm}, {}, "mul_proj").value()->output();
      if (!c.act_first) pa = g.AddNode("MatMul", {h, wa}, {}, "act_proj").value()->output();
      Value* u = g.AddNode(c.op, {pa}, {}, "act").value()->output();
      Value* y = g.AddNode("Mul", {c.act_left ? u : pm, c.act_left ? pm : u}, {}, "mul").value()->output();
      ASSERT_TRUE(g.MarkOutput(y).ok());
    });
    const std::string what = StrCat(c.op, " m=", c.m, " n=", c.n, " k=", c.k);
    const FusedGroupInfo* group = FindGroup(fused.report, "gemm_epilogue");
    ASSERT_NE(group, nullptr) << what;
    // The projections' order in the node follows the MatMuls' order in the graph.
    const int act = c.act_first ? 0 : 1;
    EXPECT_EQ(group->epilogue, StrCat("per block: ", c.op, " of projection ", act,
                                      " in place while in L2, then projection ", 1 - act,
                                      "'s GEMM multiplies by it as it stores"))
        << what;
    ASSERT_EQ(fused.outputs.size(), 1u);
    ASSERT_EQ(unfused.outputs.size(), 1u);
    EXPECT_EQ(std::memcmp(fused.outputs[0].data(), unfused.outputs[0].data(), fused.outputs[0].nbytes()), 0) << what;
    // And against float64, loosely: the f32 dot products dominate the error.
    const Tensor wa = std::move(*RandomTensor({c.k, c.n}, 31)), wm = std::move(*RandomTensor({c.k, c.n}, 32));
    const Tensor& hx = unfused.inputs[0];
    double worst = 0, peak = 0;
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double a = 0, b = 0;
        for (int64_t q = 0; q < c.k; ++q) {
          a += hx.GetAsDouble(i * c.k + q) * wa.GetAsDouble(q * c.n + j);
          b += hx.GetAsDouble(i * c.k + q) * wm.GetAsDouble(q * c.n + j);
        }
        const std::string op = c.op;
        const double u = op == "Silu" ? a / (1 + std::exp(-a)) : op == "Gelu" ? 0.5 * a * std::erfc(-a / std::sqrt(2.0))
                                                                             : std::tanh(a);
        const double want = u * b;
        const double err = std::fabs(want - fused.outputs[0].GetAsDouble(i * c.n + j)) / (1 + std::fabs(want));
        if (!(err <= worst)) worst = err;  // a NaN sticks
        peak = std::max(peak, std::fabs(want));
      }
    EXPECT_LT(worst, 2e-5 * static_cast<double>(c.k) / kK) << what;
    EXPECT_GT(peak, 0.1) << what << ": outputs near zero would prove nothing";
  }
}

// The bias-activation form out = U(p + bias), U(p) or p + bias (GPT-2's and BERT's first MLP
// projection) finishes each block in place right after its GEMM (fused_gemm.cc). It must give
// the unfused plan's bits (MatMul, Add, U one by one on the same packed blocks) with the bias
// on either side of the Add, as a [N] constant or a [1, N] input, ragged rows, a last block
// that is not a whole number of vectors (n = 84), and K long enough for several chunks.
TEST(FuseGemm, BiasActivationEpilogueGivesTheUnfusedBits) {
  struct Case {
    const char* op;  // "" : no U
    bool bias, bias_left, bias_input;
    int64_t m, n, k;
  };
  for (const Case& c : {Case{"GeluTanh", true, false, false, kM, 84, 512}, Case{"Gelu", true, true, true, 37, 1000, kK},
                        Case{"Relu", true, false, true, 1, 84, kK}, Case{"Tanh", false, false, false, kM, 84, 512},
                        Case{"", true, true, false, 37, 84, kK}}) {
    auto [unfused, fused] = BuildAndRun([&c](Graph& g) {
      Value* h = g.AddInput("h", DType::kF32, {c.m, c.k}).value();
      Value* w = g.AddConstant("w", RandomTensor({c.k, c.n}, 41)).value();
      Value* y = g.AddNode("MatMul", {h, w}, {}, "proj").value()->output();
      if (c.bias) {
        Value* b = c.bias_input ? g.AddInput("b", DType::kF32, {1, c.n}).value()
                                : g.AddConstant("b", RandomTensor({c.n}, 42)).value();
        y = g.AddNode("Add", {c.bias_left ? b : y, c.bias_left ? y : b}, {}, "bias").value()->output();
      }
      if (*c.op) y = g.AddNode(c.op, {y}, {}, "act").value()->output();
      ASSERT_TRUE(g.MarkOutput(y).ok());
    });
    const std::string what = StrCat(*c.op ? c.op : "no U", c.bias ? " with bias" : "", " m=", c.m, " n=", c.n);
    const FusedGroupInfo* group = FindGroup(fused.report, "gemm_epilogue");
    ASSERT_NE(group, nullptr) << what;
    const std::string act = StrCat("per block, in place while in L2: ", c.op);
    EXPECT_EQ(group->epilogue, !*c.op ? "as the GEMM stores: p + bias"
                               : c.bias ? "as the GEMM stores: p + bias; then " + act
                                        : act)
        << what;
    ASSERT_EQ(fused.outputs.size(), 1u);
    ASSERT_EQ(unfused.outputs.size(), 1u);
    EXPECT_EQ(std::memcmp(fused.outputs[0].data(), unfused.outputs[0].data(), fused.outputs[0].nbytes()), 0) << what;
    // Against float64, loosely: the f32 dot products dominate the error.
    const Tensor w = std::move(*RandomTensor({c.k, c.n}, 41));
    const Tensor& hx = unfused.inputs[0];
    const Tensor* bias_in = c.bias && c.bias_input ? &unfused.inputs[1] : nullptr;
    const Tensor bias_const = std::move(*RandomTensor({c.n}, 42));
    const std::string op = c.op;
    double worst = 0, peak = 0;
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double a = 0;
        for (int64_t q = 0; q < c.k; ++q) a += hx.GetAsDouble(i * c.k + q) * w.GetAsDouble(q * c.n + j);
        if (c.bias) a += bias_in ? bias_in->GetAsDouble(j) : bias_const.GetAsDouble(j);
        const double want = op == "GeluTanh" ? 0.5 * a * (1 + std::tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))
                            : op == "Gelu"   ? 0.5 * a * std::erfc(-a / std::sqrt(2.0))
                            : op == "Relu"   ? std::max(a, 0.0)
                            : op == "Tanh"   ? std::tanh(a)
                                             : a;
        const double err = std::fabs(want - fused.outputs[0].GetAsDouble(i * c.n + j)) / (1 + std::fabs(want));
        if (!(err <= worst)) worst = err;  // a NaN sticks
        peak = std::max(peak, std::fabs(want));
      }
    EXPECT_LT(worst, 2e-5 * static_cast<double>(c.k) / kK) << what;
    EXPECT_GT(peak, 0.1) << what << ": outputs near zero would prove nothing";
  }
}

// The store-chain form (fused_gemm.cc): each output is a projection with biases and residuals
// added one Add after another, which the GEMM adds as it stores each block (a first bias as the
// matmul's bias, residuals as binary post-ops), straight into the outputs. Q, K and V with their
// own biases (one on the left of its Add, one a [1, N] input); a bias, then a residual on the
// left; a residual, then a bias (not a chain the GEMM takes: the epilogue runs after it); K
// long enough for several chunks. Each gives the unfused plan's bits (MatMul and the Adds one
// by one, on the same packed blocks), and float64's values. n = 84: a last block of columns
// that is not a whole number of vectors.
TEST(FuseGemm, StoreChainGivesTheUnfusedBits) {
  enum class Form { kQkvBiases, kBiasThenResidual, kResidualThenBias };
  struct Case {
    Form form;
    int64_t m, n, k;
  };
  for (const Case& c : {Case{Form::kQkvBiases, 37, 84, kK}, Case{Form::kQkvBiases, 1, 84, 512},
                        Case{Form::kBiasThenResidual, 37, 84, 512}, Case{Form::kResidualThenBias, kM, 84, kK}}) {
    const int projections = c.form == Form::kQkvBiases ? 3 : 1;
    auto [unfused, fused] = BuildAndRun([&c, projections](Graph& g) {
      Value* h = g.AddInput("h", DType::kF32, {c.m, c.k}).value();
      Value* r = c.form == Form::kQkvBiases ? nullptr : g.AddInput("r", DType::kF32, {c.m, c.n}).value();
      for (int s = 0; s < projections; ++s) {
        const std::string t = std::to_string(s);
        Value* w = g.AddConstant("w" + t, RandomTensor({c.k, c.n}, 61 + s)).value();
        Value* y = g.AddNode("MatMul", {h, w}, {}, "proj" + t).value()->output();
        Value* b = s == 2 ? g.AddInput("b" + t, DType::kF32, {1, c.n}).value()
                          : g.AddConstant("b" + t, RandomTensor({c.n}, 71 + s)).value();
        if (c.form == Form::kResidualThenBias) {
          y = g.AddNode("Add", {y, r}, {}, "residual").value()->output();
          y = g.AddNode("Add", {y, b}, {}, "bias").value()->output();
        } else {
          y = g.AddNode("Add", {s == 1 ? b : y, s == 1 ? y : b}, {}, "bias" + t).value()->output();
          if (r) y = g.AddNode("Add", {r, y}, {}, "residual").value()->output();
        }
        ASSERT_TRUE(g.MarkOutput(y).ok());
      }
    });
    const std::string what = StrCat("form ", static_cast<int>(c.form), " m=", c.m, " k=", c.k);
    const FusedGroupInfo* group = FindGroup(fused.report, "gemm_epilogue");
    ASSERT_NE(group, nullptr) << what;
    if (c.form == Form::kQkvBiases) {
      EXPECT_NE(group->kernel_name.find("split3"), std::string::npos) << group->kernel_name;
    }
    // What `graphfuse explain` says of it. With one row, the [1, N] bias has the output's shape:
    // an operand added as a residual is.
    const std::string qkv = StrCat("as the GEMM stores: p0 + bias; p1 + bias; p2 + ", c.m == 1 ? "residual" : "bias");
    EXPECT_EQ(group->epilogue, c.form == Form::kQkvBiases         ? qkv
                               : c.form == Form::kBiasThenResidual ? "as the GEMM stores: p + bias + residual"
                                                                   : "after the GEMMs, over whole rows")
        << what;
    ASSERT_EQ(fused.outputs.size(), static_cast<size_t>(projections));
    ASSERT_EQ(unfused.outputs.size(), static_cast<size_t>(projections));
    for (int s = 0; s < projections; ++s) {
      EXPECT_EQ(std::memcmp(fused.outputs[s].data(), unfused.outputs[s].data(), fused.outputs[s].nbytes()), 0)
          << what << ", output " << s;
      // Against float64, loosely: the f32 dot products dominate the error.
      const Tensor w = std::move(*RandomTensor({c.k, c.n}, 61 + s));
      const Tensor b_const = std::move(*RandomTensor({c.n}, 71 + s));
      const Tensor& hx = unfused.inputs[0];
      const Tensor* rx = c.form == Form::kQkvBiases ? nullptr : &unfused.inputs[1];
      const Tensor* b_in = s == 2 ? &unfused.inputs[1] : nullptr;
      double worst = 0, peak = 0;
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
          double want = b_in ? b_in->GetAsDouble(j) : b_const.GetAsDouble(j);
          if (rx) want += rx->GetAsDouble(i * c.n + j);
          for (int64_t q = 0; q < c.k; ++q) want += hx.GetAsDouble(i * c.k + q) * w.GetAsDouble(q * c.n + j);
          const double err = std::fabs(want - fused.outputs[s].GetAsDouble(i * c.n + j)) / (1 + std::fabs(want));
          if (!(err <= worst)) worst = err;  // a NaN sticks
          peak = std::max(peak, std::fabs(want));
        }
      EXPECT_LT(worst, 2e-5 * static_cast<double>(c.k) / kK) << what << ", output " << s;
      EXPECT_GT(peak, 0.1) << what << ": outputs near zero would prove nothing";
    }
  }
}

// h [m, k] @ W + r [m, kN] (inputs h, r; W constant from `seed`), r on the left or the right
// of the Add.
Builder ResidualGraph(int64_t m, int64_t k, uint32_t seed, bool r_left) {
  return [=](Graph& g) {
    Value* h = g.AddInput("h", DType::kF32, {m, k}).value();
    Value* r = g.AddInput("r", DType::kF32, {m, kN}).value();
    Value* w = g.AddConstant("w", RandomTensor({k, kN}, seed)).value();
    Value* p = g.AddNode("MatMul", {h, w}, {}, "proj").value()->output();
    Value* sum = g.AddNode("Add", {r_left ? r : p, r_left ? p : r}, {}, "residual").value()->output();
    ASSERT_TRUE(g.MarkOutput(sum).ok());
  };
}

// The epilogue runs over chunks of whole rows after the GEMM blocks (fused_gemm.cc): row counts
// that do not divide into the chunks, and a single row, must come out whole.
TEST(FuseGemm, EpilogueChunksCoverRaggedRowCounts) {
  for (const int64_t m : {int64_t{1}, int64_t{37}, int64_t{301}}) {
    auto [unfused, fused] = BuildAndRun(ResidualGraph(m, kK, 71, /*r_left=*/false));
    ASSERT_NE(FindGroup(fused.report, "gemm_epilogue"), nullptr) << "m=" << m;
    ExpectClose(unfused.outputs, fused.outputs);
  }
}

// out = x @ W + r, the residual form: the GEMM adds r as it stores each block (oneDNN's
// binary-add post-op on packed weights: the same bits as MatMul then Add, whose MatMul runs on
// the same packed blocks), or accumulates onto a copy of r (sgemm's beta = 1 when the node runs
// without its packed state, as RunNodeOnce runs it). All against float64, and K = 0 (out = r).
TEST(FuseGemm, ResidualEpilogueAccumulatesOntoTheResidual) {
  for (const int64_t k : {kK, int64_t{0}, int64_t{512}}) {  // 512: oneDNN sums K in several chunks
    auto [unfused, fused] = BuildAndRun(ResidualGraph(kM, k, 73, /*r_left=*/true));
    ASSERT_NE(FindGroup(fused.report, "gemm_epilogue"), nullptr) << "k=" << k;
    const Node* node = nullptr;
    for (const auto& n : fused.graph->nodes())
      if (n->op() == "FusedGemm") node = n.get();
    ASSERT_NE(node, nullptr);
    // float64: out[i, j] = r[i, j] + sum_k h[i, k] w[k, j].
    const float* hv = unfused.inputs[0].data_as<float>();
    const float* rv = unfused.inputs[1].data_as<float>();
    const float* wv = node->input(1)->constant()->data_as<float>();
    std::vector<double> want(static_cast<size_t>(kM * kN));
    for (int64_t i = 0; i < kM; ++i)
      for (int64_t j = 0; j < kN; ++j) {
        double acc = rv[i * kN + j];
        for (int64_t q = 0; q < k; ++q) acc += static_cast<double>(hv[i * k + q]) * wv[q * kN + j];
        want[static_cast<size_t>(i * kN + j)] = acc;
      }
    // The same node run without its packed state (the sgemm path).
    Tensor once = Tensor::Empty(DType::kF32, {kM, kN}).value();
    std::vector<TensorView> in;
    for (const Value* v : node->inputs())
      in.push_back(v->constant() ? v->constant()->view() : unfused.inputs[v == fused.graph->inputs()[0] ? 0 : 1].view());
    std::vector<TensorView> out{once.view()};
    ThreadPool pool(2);
    ASSERT_TRUE(RunNodeOnce(*node, in, out, CpuContext{&pool}).ok());
    for (const Tensor* t : std::initializer_list<const Tensor*>{&fused.outputs[0], &unfused.outputs[0], &once})
      for (int64_t i = 0; i < kM * kN; ++i) {
        const double w = want[static_cast<size_t>(i)];
        ASSERT_NEAR(t->GetAsDouble(i), w, 1e-5 * (1 + static_cast<double>(k) / kK) * (1 + std::fabs(w)))
            << "k=" << k << " element " << i;
      }
    EXPECT_EQ(std::memcmp(fused.outputs[0].data(), unfused.outputs[0].data(), fused.outputs[0].nbytes()), 0)
        << "k=" << k << ": the residual GEMM does not give MatMul then Add's bits";
  }
}

// The epilogue's runner is kept between launches of a plan and reused only while the buffers it
// was built for hold: runs alternating between two sets of buffers (the epilogue reads the graph
// input r, and writes the graph output) must each match the unfused plan on the same inputs.
TEST(FuseGemm, EpilogueRunnerIsReusedOnlyWhileItsBuffersHold) {
  auto build = [](Graph& g) {
    Value* h = g.AddInput("h", DType::kF32, {kM, kK}).value();
    Value* r = g.AddInput("r", DType::kF32, {kM, kN}).value();
    Value* wg = g.AddConstant("wg", RandomTensor({kK, kN}, 81)).value();
    Value* wu = g.AddConstant("wu", RandomTensor({kK, kN}, 82)).value();
    Value* gate = g.AddNode("MatMul", {h, wg}, {}, "gate").value()->output();
    Value* up = g.AddNode("MatMul", {h, wu}, {}, "up").value()->output();
    Value* y =
        g.AddNode("Mul", {g.AddNode("Silu", {gate}, {}, "silu").value()->output(), up}, {}, "mul").value()->output();
    ASSERT_TRUE(g.MarkOutput(g.AddNode("Add", {y, r}, {}, "add").value()->output()).ok());
  };
  Graph fused_graph, unfused_graph;
  build(fused_graph);
  build(unfused_graph);
  FusionReport report;
  PipelineOptions on;
  on.fusion_report = &report;
  ASSERT_TRUE(RunPipeline(fused_graph, cpu::DefaultCpuTarget(), on).ok());
  ASSERT_NE(FindGroup(report, "gemm_epilogue"), nullptr);
  PipelineOptions off;
  off.fusion.enabled = false;
  ASSERT_TRUE(RunPipeline(unfused_graph, cpu::DefaultCpuTarget(), off).ok());
  auto fused = ExecutionPlan::Compile(fused_graph);
  auto unfused = ExecutionPlan::Compile(unfused_graph);
  ASSERT_TRUE(fused.ok() && unfused.ok());
  ThreadPool pool(2);
  const CpuContext ctx{&pool};
  std::vector<Tensor> inputs;  // h0, r0, h1, r1
  std::vector<std::vector<Tensor>> outputs(2);  // one buffer each
  for (uint32_t i = 0; i < 2; ++i) {
    inputs.push_back(std::move(*RandomTensor({kM, kK}, 500 + i)));
    inputs.push_back(std::move(*RandomTensor({kM, kN}, 600 + i)));
    outputs[i].push_back(Tensor::Empty(DType::kF32, {kM, kN}).value());
  }
  for (int round = 0; round < 4; ++round) {
    const size_t which = static_cast<size_t>(round % 2);
    std::fill_n(outputs[which][0].data_as<float>(), kM * kN, std::nanf(""));
    const TensorView in[] = {inputs[2 * which].view(), inputs[2 * which + 1].view()};
    const TensorView out[] = {outputs[which][0].view()};
    ASSERT_TRUE((*fused)->Run(in, out, ctx).ok());
    auto want = (*unfused)->Run(in, ctx);
    ASSERT_TRUE(want.ok());
    ExpectClose(*want, outputs[which]);
    if (::testing::Test::HasFailure()) FAIL() << "round " << round;
  }
}

TEST(FuseGemm, ReferenceGraphReproducesTheFusedNode) {
  auto [unfused, fused] = BuildAndRun([](Graph& g) {
    Value* h = g.AddInput("h", DType::kF32, {kM, kK}).value();
    Value* wg = g.AddConstant("wg", RandomTensor({kK, kN}, 61)).value();
    Value* wu = g.AddConstant("wu", RandomTensor({kK, kN}, 62)).value();
    Value* gate = g.AddNode("MatMul", {h, wg}, {}, "gate").value()->output();
    Value* up = g.AddNode("MatMul", {h, wu}, {}, "up").value()->output();
    Value* y = g.AddNode("Mul", {g.AddNode("Gelu", {gate}, {}, "gelu").value()->output(), up}, {}, "mul")
                   .value()
                   ->output();
    ASSERT_TRUE(g.MarkOutput(y).ok());
    ASSERT_TRUE(g.MarkOutput(up).ok());  // a projection read outside: a direct output too
  });
  const Node* node = nullptr;
  for (const auto& n : fused.graph->nodes())
    if (n->op() == "FusedGemm") node = n.get();
  ASSERT_NE(node, nullptr);
  EXPECT_EQ(node->outputs().size(), 2u);
  const Graph* ref = node->GetGraph("reference");
  ASSERT_NE(ref, nullptr);
  std::vector<TensorView> in;
  for (const Value* v : node->inputs()) {
    if (v->constant()) in.push_back(v->constant()->view());
    else in.push_back(unfused.inputs[0].view());
  }
  ThreadPool pool(2);
  auto want = Execute(*ref, in, CpuContext{&pool});
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  // The graph outputs are (y, up); the node's outputs are (up, y): projections come first.
  std::vector<Tensor> node_order;
  node_order.push_back(std::move((*want)[1]));
  node_order.push_back(std::move((*want)[0]));
  ExpectClose(node_order, fused.outputs);
  ExpectClose(unfused.outputs, fused.outputs);
}

// FoldNormIntoGemm (src/passes/fold_norm.cc): h = a Wo + x (a store chain), y = RMSNorm(h, gamma),
// then GEMMs reading y. The norm runs inside the two GEMMs: the first writes each row's 1/rms,
// the second's weights take gamma and its projections the row's 1/rms. Checked against the
// unfused plan and against float64 (h, s = 1/sqrt(mean(h^2) + eps) and the outputs written out
// here), for the gated form (SwiGLU), for a reader whose epilogue runs after the GEMMs, for
// three projections of y, and for a producer whose epilogue is a pass over whole rows (its
// row sums then come from a pass of their own). eps = 0.5 in one case: a wrong epsilon shows.
struct FoldCase {
  const char* reader;  // "swiglu", "bias_tanh", "qkv"
  bool chain;          // the producer is a store chain (else Relu(a Wo + x): a pass)
  int64_t m, k, f;     // rows, hidden (the norm's width), the readers' width
  float eps;
};

// The readers' weights: uniform with variance 1/k, as a trained layer's, so that their outputs
// stay of the order of y's and a Tanh reader does not saturate (a saturated Tanh would hide an
// error, and the checks below scale with the outputs' peak, not with the sums under them).
std::shared_ptr<Tensor> ReaderWeight(const FoldCase& c, uint32_t seed) {
  return RandomTensor({c.k, c.f}, seed, std::sqrt(3.0 / static_cast<double>(c.k)));
}

void BuildFoldGraph(Graph& g, const FoldCase& c, bool gamma_constant = true) {
  Value* a = g.AddInput("a", DType::kF32, {c.m, c.k}).value();
  Value* x = g.AddInput("x", DType::kF32, {c.m, c.k}).value();
  Value* wo = g.AddConstant("wo", RandomTensor({c.k, c.k}, 71, 0.2)).value();
  Value* p = g.AddNode("MatMul", {a, wo}, {}, "o_proj").value()->output();
  Value* h = g.AddNode("Add", {p, x}, {}, "residual").value()->output();
  if (!c.chain) h = g.AddNode("Relu", {h}, {}, "relu").value()->output();
  Value* gamma = gamma_constant ? g.AddConstant("gamma", RandomTensor({c.k}, 72, 2.0)).value()
                                : g.AddInput("gamma", DType::kF32, {c.k}).value();
  Value* y = g.AddNode("RMSNorm", {h, gamma}, {{"epsilon", c.eps}}, "norm").value()->output();
  const std::string reader = c.reader;
  std::vector<Value*> outs;
  auto proj = [&](const char* name, uint32_t seed) {
    Value* w = g.AddConstant(std::string("w_") + name, ReaderWeight(c, seed)).value();
    return g.AddNode("MatMul", {y, w}, {}, name).value()->output();
  };
  if (reader == "swiglu") {
    Value* gt = proj("gate", 73);
    Value* up = proj("up", 74);
    outs.push_back(g.AddNode("Mul", {g.AddNode("Silu", {gt}, {}, "silu").value()->output(), up}, {}, "mul")
                       .value()
                       ->output());
  } else if (reader == "bias_tanh") {
    Value* b = g.AddConstant("b", RandomTensor({c.f}, 75)).value();
    Value* t = g.AddNode("Add", {proj("fc", 76), b}, {}, "bias").value()->output();
    outs.push_back(g.AddNode("Tanh", {t}, {}, "tanh").value()->output());
  } else {
    for (const char* n : {"q", "k", "v"}) outs.push_back(proj(n, static_cast<uint32_t>(77 + n[0])));
  }
  outs.push_back(h);  // the residual stream goes on
  for (Value* o : outs) ASSERT_TRUE(g.MarkOutput(o).ok());
}

// The float64 outputs of BuildFoldGraph's graph on inputs (a, x), and each row's 1/rms.
std::vector<std::vector<double>> FoldReference(const FoldCase& c, const Tensor& a, const Tensor& x,
                                               std::vector<double>* inv_rms) {
  const Tensor wo = std::move(*RandomTensor({c.k, c.k}, 71, 0.2)), gamma = std::move(*RandomTensor({c.k}, 72, 2.0));
  auto mat = [&](const std::vector<double>& lhs, const Tensor& w, int64_t n) {
    std::vector<double> out(static_cast<size_t>(c.m * n), 0.0);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t q = 0; q < c.k; ++q)
        for (int64_t j = 0; j < n; ++j) out[i * n + j] += lhs[i * c.k + q] * w.GetAsDouble(q * n + j);
    return out;
  };
  std::vector<double> av(static_cast<size_t>(c.m * c.k)), h;
  for (int64_t i = 0; i < c.m * c.k; ++i) av[i] = a.GetAsDouble(i);
  h = mat(av, wo, c.k);
  for (int64_t i = 0; i < c.m * c.k; ++i) {
    h[i] += x.GetAsDouble(i);
    if (!c.chain) h[i] = std::max(h[i], 0.0);
  }
  std::vector<double> y(h.size());
  inv_rms->assign(static_cast<size_t>(c.m), 0.0);
  for (int64_t i = 0; i < c.m; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < c.k; ++j) ss += h[i * c.k + j] * h[i * c.k + j];
    (*inv_rms)[i] = 1 / std::sqrt(ss / c.k + c.eps);
    for (int64_t j = 0; j < c.k; ++j) y[i * c.k + j] = h[i * c.k + j] * (*inv_rms)[i] * gamma.GetAsDouble(j);
  }
  auto w = [&](uint32_t seed) { return std::move(*ReaderWeight(c, seed)); };
  std::vector<std::vector<double>> outs;
  const std::string reader = c.reader;
  if (reader == "swiglu") {
    std::vector<double> gt = mat(y, w(73), c.f), up = mat(y, w(74), c.f);
    for (size_t i = 0; i < gt.size(); ++i) gt[i] = gt[i] / (1 + std::exp(-gt[i])) * up[i];
    outs.push_back(gt);
  } else if (reader == "bias_tanh") {
    const Tensor b = std::move(*RandomTensor({c.f}, 75));
    std::vector<double> t = mat(y, w(76), c.f);
    for (size_t i = 0; i < t.size(); ++i) t[i] = std::tanh(t[i] + b.GetAsDouble(static_cast<int64_t>(i) % c.f));
    outs.push_back(t);
  } else {
    for (const char* n : {"q", "k", "v"}) outs.push_back(mat(y, w(static_cast<uint32_t>(77 + n[0])), c.f));
  }
  outs.push_back(h);
  return outs;
}

TEST(FoldNormIntoGemm, NormRunsInsideTheGemmsAndMatchesFloat64) {
  for (const FoldCase& c : {FoldCase{"swiglu", true, 37, 512, 84, 1e-5f}, FoldCase{"swiglu", true, 1, 48, 84, 0.5f},
                            FoldCase{"bias_tanh", true, 12, 320, 80, 1e-5f}, FoldCase{"qkv", true, 8, 96, 64, 0.5f},
                            FoldCase{"swiglu", false, 20, 272, 84, 0.5f}}) {
    const std::string what = StrCat(c.reader, c.chain ? " after a store chain" : " after a pass", " m=", c.m,
                                    " k=", c.k, " eps=", c.eps);
    FusionOptions options;
    options.norm_into_gemm = true;
    auto [unfused, fused] = BuildAndRun([&c](Graph& g) { BuildFoldGraph(g, c); }, options);
    EXPECT_EQ(CountOp(*fused.graph, "RMSNorm"), 0) << what;
    EXPECT_EQ(CountOp(*fused.graph, "FusedGemm"), 2) << what;
    const Node* producer = nullptr;
    const Node* reader = nullptr;
    for (const auto& n : fused.graph->nodes()) {
      if (n->attrs().count("rms_epsilon")) producer = n.get();
      if (n->GetInt("row_scale", -1) >= 0) reader = n.get();
    }
    ASSERT_NE(producer, nullptr) << what;
    ASSERT_NE(reader, nullptr) << what;
    EXPECT_EQ(reader->input(reader->GetInt("row_scale", -1)), producer->outputs().back()) << what;
    const FusedGroupInfo* group = nullptr;
    for (const FusedGroupInfo& gi : fused.report.groups)
      if (gi.name == reader->name()) group = &gi;
    ASSERT_NE(group, nullptr) << what;
    EXPECT_EQ(group->nodes.front(), "norm") << what;
    EXPECT_NE(FusedGemmEpilogueForm(*producer)
                  .find(c.chain ? "1/rms of the output for the next GEMM (a folded RMSNorm), per block while in L2"
                                : "1/rms of the output for the next GEMM (a folded RMSNorm), after the GEMMs"),
              std::string::npos)
        << what << ": " << FusedGemmEpilogueForm(*producer);
    if (std::string(c.reader) == "swiglu") {
      EXPECT_EQ(group->epilogue, "each projection times its row's 1/rms (a folded RMSNorm); per block: Silu of "
                                 "projection 0 in place while in L2, then projection 1's GEMM multiplies by it as "
                                 "it stores")
          << what;
    }
    ASSERT_EQ(fused.outputs.size(), unfused.outputs.size()) << what;
    // Against the unfused plan: the products are rounded in another order (gamma into W).
    for (size_t o = 0; o < fused.outputs.size(); ++o) {
      const double peak = MaxAbs(unfused.outputs[o]);
      EXPECT_GT(peak, 0.1) << what << ": output " << o << " near zero would prove nothing";
      EXPECT_LE(MaxAbsDiff(fused.outputs[o], unfused.outputs[o]), 2e-6 * peak * std::sqrt(c.k / 48.0))
          << what << ": output " << o;
    }
    // Against float64.
    std::vector<double> inv_rms;
    const auto want = FoldReference(c, unfused.inputs[0], unfused.inputs[1], &inv_rms);
    ASSERT_EQ(want.size(), fused.outputs.size()) << what;
    for (size_t o = 0; o < want.size(); ++o) {
      double worst = 0;
      for (size_t i = 0; i < want[o].size(); ++i) {
        const double err = std::fabs(want[o][i] - fused.outputs[o].GetAsDouble(static_cast<int64_t>(i))) /
                           (1 + std::fabs(want[o][i]));
        if (!(err <= worst)) worst = err;  // a NaN sticks
      }
      EXPECT_LT(worst, 2e-5 * static_cast<double>(c.k) / kK) << what << ": output " << o;  // as the gated test
    }
    // The producer's 1/rms itself, as a graph output: within an ulp of float64's on the fused h.
    Value* s = const_cast<Value*>(producer->outputs().back());
    ASSERT_TRUE(fused.graph->MarkOutput(s).ok());
    ThreadPool pool(2);
    auto got = Execute(*fused.graph, Views(unfused.inputs), CpuContext{&pool});
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    const Tensor& hs = (*got)[got->size() - 2];
    const Tensor& ss = got->back();
    ASSERT_EQ(ss.numel(), c.m) << what;
    for (int64_t i = 0; i < c.m; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < c.k; ++j) sum += hs.GetAsDouble(i * c.k + j) * hs.GetAsDouble(i * c.k + j);
      const double want_s = 1 / std::sqrt(sum / c.k + c.eps);
      EXPECT_LE(std::fabs(ss.GetAsDouble(i) - want_s), 1.2e-7 * want_s) << what << ": row " << i;
    }
  }
}

TEST(FoldNormIntoGemm, NormStaysAKernelWhereItCannotFold) {
  const FoldCase c{"swiglu", true, 12, 48, 80, 1e-5f};
  FusionOptions options;
  options.norm_into_gemm = true;
  {  // the scale is an input, not a constant: refused with its code
    auto [unfused, fused] = BuildAndRun([&c](Graph& g) { BuildFoldGraph(g, c, false); }, options);
    EXPECT_EQ(CountOp(*fused.graph, "RMSNorm"), 1);
    const FusionRefusal* r = FindRefusal(fused.report, "norm-not-foldable");
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->producer, "norm");
    ExpectClose(unfused.outputs, fused.outputs);
  }
  {  // the norm's output is also a graph output
    auto [unfused, fused] = BuildAndRun(
        [&c](Graph& g) {
          BuildFoldGraph(g, c);
          for (const auto& n : g.nodes())
            if (n->op() == "RMSNorm") {
              ASSERT_TRUE(g.MarkOutput(n->output()).ok());
            }
        },
        options);
    EXPECT_EQ(CountOp(*fused.graph, "RMSNorm"), 1);
    ExpectClose(unfused.outputs, fused.outputs);
  }
  {  // the option off (as RunPipeline sets it for a target without the form: CUDA)
    FusionOptions off = options;
    off.norm_into_gemm = false;
    auto [unfused, fused] = BuildAndRun([&c](Graph& g) { BuildFoldGraph(g, c); }, off);
    EXPECT_EQ(CountOp(*fused.graph, "RMSNorm"), 1);
    for (const auto& n : fused.graph->nodes()) {
      EXPECT_EQ(n->attrs().count("rms_epsilon"), 0u);
      EXPECT_EQ(n->GetInt("row_scale", -1), -1);
    }
  }
  {  // excluded
    FusionOptions ex = options;
    ex.exclude.insert("norm");
    auto [unfused, fused] = BuildAndRun([&c](Graph& g) { BuildFoldGraph(g, c); }, ex);
    EXPECT_EQ(CountOp(*fused.graph, "RMSNorm"), 1);
    EXPECT_NE(FindRefusal(fused.report, "excluded"), nullptr);
  }
}

// Each folded node's reference graph (what --check-fusion runs) gives its outputs.
TEST(FoldNormIntoGemm, ReferenceGraphsReproduceTheFoldedNodes) {
  const FoldCase c{"swiglu", true, 12, 48, 80, 1e-5f};
  FusionOptions options;
  options.norm_into_gemm = true;
  auto [unfused, fused] = BuildAndRun([&c](Graph& g) { BuildFoldGraph(g, c); }, options);
  // Every value of the fused plan, by running it with each node's outputs marked.
  Graph& g = *fused.graph;
  std::vector<const Value*> all;
  for (const auto& n : g.nodes())
    for (const Value* o : n->outputs())
      if (!o->is_graph_output()) {
        ASSERT_TRUE(g.MarkOutput(const_cast<Value*>(o)).ok());
      }
  for (const Value* o : g.outputs()) all.push_back(o);
  ThreadPool pool(2);
  auto vals = Execute(g, Views(unfused.inputs), CpuContext{&pool});
  ASSERT_TRUE(vals.ok()) << vals.status().ToString();
  auto value_of = [&](const Value* v) -> TensorView {
    if (v->constant()) return v->constant()->view();
    for (size_t i = 0; i < g.inputs().size(); ++i)
      if (g.inputs()[i] == v) return unfused.inputs[i].view();
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i] == v) return (*vals)[i].view();
    ADD_FAILURE() << "no value for " << v->name();
    return {};
  };
  int checked = 0;
  for (const auto& n : g.nodes()) {
    if (!n->attrs().count("rms_epsilon") && n->GetInt("row_scale", -1) < 0) continue;
    const Graph* ref = n->GetGraph("reference");
    ASSERT_NE(ref, nullptr) << n->name();
    std::vector<TensorView> in;
    for (const Value* v : n->inputs()) in.push_back(value_of(v));
    auto want = Execute(*ref, in, CpuContext{&pool});
    ASSERT_TRUE(want.ok()) << n->name() << ": " << want.status().ToString();
    ASSERT_EQ(want->size(), n->outputs().size()) << n->name();
    for (size_t o = 0; o < want->size(); ++o) {
      Tensor got = Tensor::Empty(DType::kF32, n->output(o)->shape()).value();
      const TensorView v = value_of(n->output(o));
      std::memcpy(got.data(), v.data, got.nbytes());
      const double peak = MaxAbs((*want)[o]);
      EXPECT_GT(peak, 0.0) << n->name() << " output " << o;
      EXPECT_LE(MaxAbsDiff((*want)[o], got), 2e-6 * peak) << n->name() << " output " << o;
    }
    // The node run once, without the packed weights its plan prepares: the sgemm path.
    std::vector<Tensor> once;
    std::vector<TensorView> once_views;
    for (const Value* o : n->outputs()) once.push_back(Tensor::Empty(DType::kF32, o->shape()).value());
    for (Tensor& t : once) once_views.push_back(t.view());
    ASSERT_TRUE(RunNodeOnce(*n, in, once_views, CpuContext{&pool}).ok()) << n->name();
    for (size_t o = 0; o < want->size(); ++o)
      EXPECT_LE(MaxAbsDiff((*want)[o], once[o]), 2e-6 * MaxAbs((*want)[o])) << n->name() << " output " << o << ", once";
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

}  // namespace
}  // namespace graphfuse
