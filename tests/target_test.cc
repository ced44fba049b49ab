// The pipeline takes its target-specific decisions from the Target it is given: a backend
// written here, outside the library, gets no CPU-only form, its own cost policy, and its own
// host evaluation for constant folding.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "cpu/cpu_target.h"
#include "graph_test_util.h"
#include "cpu/executor.h"
#include "graphfuse/thread_pool.h"
#include "ir/text.h"
#include "passes/fuse_elementwise.h"
#include "passes/pipeline.h"
#include "testing/blocks.h"

namespace graphfuse {
namespace {

// A backend with no fused form of its own, configurable costs, and a count of the nodes it
// evaluated for constant folding (it evaluates them with the CPU's kernels).
class TestTarget final : public Target {
 public:
  explicit TestTarget(TargetCosts costs) : costs_(costs) {}
  std::string_view name() const override { return "test"; }
  TargetCosts costs() const override { return costs_; }
  TargetForms forms() const override { return {}; }
  bool HasKernel(const Node& node) const override { return cpu::DefaultCpuTarget().HasKernel(node); }
  Status EvaluateOnHost(const Node& node, std::span<const TensorView> in,
                        std::span<const TensorView> out) const override {
    ++evaluated;
    return cpu::DefaultCpuTarget().EvaluateOnHost(node, in, out);
  }
  Result<std::unique_ptr<Executable>> Compile(std::shared_ptr<const Graph> graph) const override {
    return cpu::DefaultCpuTarget().Compile(std::move(graph));
  }
  mutable std::atomic<int> evaluated{0};

 private:
  TargetCosts costs_;
};

// A small LLaMA block: the CPU target folds its RMSNorms into the GEMMs and moves the QKV
// projection inside the attention; a target without those forms keeps both apart.
TEST(Target, FormsComeFromTheTarget) {
  ThreadPool pool(2);
  const CpuContext ctx{&pool};
  auto cfg = BlockPreset("llama-small");
  ASSERT_TRUE(cfg.ok());
  cfg->seq = 8, cfg->batch = 1, cfg->hidden = 64, cfg->heads = 4, cfg->ffn = 96;
  auto w = MakeBlockWeights(*cfg, 3, ctx);
  ASSERT_TRUE(w.ok());
  Graph on_cpu, on_test;
  ASSERT_TRUE(BuildBlock(on_cpu, *cfg, *w).ok());
  ASSERT_TRUE(BuildBlock(on_test, *cfg, *w).ok());
  const TestTarget test({1.0, 40.0});
  ASSERT_TRUE(RunPipeline(on_cpu, cpu::DefaultCpuTarget()).ok());
  ASSERT_TRUE(RunPipeline(on_test, test).ok());

  EXPECT_EQ(CountOp(on_cpu, "RMSNorm"), 0) << "the CPU folds its norms into the GEMMs";
  EXPECT_GT(CountOp(on_test, "RMSNorm") + CountOp(on_test, "FusedNorm"), 0) << "a target without the form keeps them";
  for (const auto& n : on_test.nodes()) {
    EXPECT_EQ(n->GetInt("qkv_proj", 0), 0) << n->Describe() << ": no projected attention without the form";
    EXPECT_EQ(n->attrs().count("rms_epsilon"), 0u) << n->Describe();
  }
  int projected = 0;
  for (const auto& n : on_cpu.nodes()) projected += n->GetInt("qkv_proj", 0) == 1 ? 1 : 0;
  EXPECT_EQ(projected, 1);
}

// The cost policy prices merges with the target's costs: a launch that saves nothing and a
// bandwidth so low that the merged group's extra read costs more than the launch refuses a
// horizontal merge the CPU's costs allow.
TEST(Target, CostsComeFromTheTarget) {
  // Two readers of x, each with its own larger operand: merging them saves a launch and one read
  // of x, and the merged group reads nothing more, so any positive launch cost allows it; a
  // zero launch cost with min_saving_us above what the bytes save refuses it.
  const char* text = R"(
    graph @g(%x: f32[64,64], %a: f32[64,64], %b: f32[64,64]) {
      %p = Add(%x, %a)
      %q = Mul(%x, %b)
      return %p, %q
    }
  )";
  auto cpu_graph = ParseGraph(text);
  auto test_graph = ParseGraph(text);
  ASSERT_TRUE(cpu_graph.ok() && test_graph.ok());
  PipelineOptions options;
  options.fusion.min_saving_us = 0.5;
  const TestTarget slow_launchless({0.0, 1000.0});
  ASSERT_TRUE(RunPipeline(**cpu_graph, cpu::DefaultCpuTarget(), options).ok());
  ASSERT_TRUE(RunPipeline(**test_graph, slow_launchless, options).ok());
  EXPECT_EQ(CountKernels(**cpu_graph), 1) << "1 us per launch saved: the siblings merge";
  EXPECT_EQ(CountKernels(**test_graph), 2) << "16 KiB saved at 1000 GB/s is 0.016 us: not worth it";
}

// Constant folding evaluates with the target.
TEST(Target, ConstantFoldingEvaluatesOnTheTarget) {
  auto g = ParseGraph(R"(
    graph @g(%x: f32[4]) {
      %c: f32[4] = const [1, 2, 3, 4]
      %d = Mul(%c, %c)
      %y = Add(%x, %d)
      return %y
    }
  )");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const TestTarget test({1.0, 40.0});
  ASSERT_TRUE(RunPipeline(**g, test).ok());
  EXPECT_EQ(test.evaluated.load(), 1);
  EXPECT_EQ(CountOp(**g, "Mul"), 0);
}

TEST(Target, MakeTargetNamesWhatThisBuildHas) {
  auto cpu = MakeTarget("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ((*cpu)->name(), "cpu");
  auto none = MakeTarget("tpu");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("targets: cpu"), std::string::npos) << none.status().ToString();
}

// Each target reads its own options struct; options set for another target are refused, naming
// that target, rather than ignored.
TEST(Target, OptionsOfAnotherTargetAreRefused) {
  auto refused = MakeTarget("cpu", {.cuda = {.graph = true}});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("cuda target's options"), std::string::npos) << refused.status().ToString();
  EXPECT_TRUE(MakeTarget("cpu", {.cpu = {.threads = 1, .codegen = false}}).ok());
}

// The reference is the CPU in f32: bf16 weights make a target that is not, and its f32 form is.
TEST(Target, TheReferenceIsTheCpuInF32) {
  const std::unique_ptr<Target> ref = MakeReferenceTarget({.cpu = {.threads = 1, .bf16_weights = true}});
  EXPECT_TRUE(ref->is_reference());
  auto bf16 = ref->ForDtype(DType::kBF16);
  ASSERT_TRUE(bf16.ok()) << bf16.status().ToString();
  EXPECT_FALSE((*bf16)->is_reference());
  auto back = (*bf16)->ForDtype(DType::kF32);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE((*back)->is_reference());
  EXPECT_EQ(ref->CopyGbps(1 << 20, 1).status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(ref->WriteKernelSources(Graph(), "/tmp").status().code(), StatusCode::kUnimplemented);
}

// A CPU executable reports its launches and arena, shows every node of an observed run with its
// buffers (whose outputs are the run's), and has no device time.
TEST(Target, CpuExecutableStatsAndObservedRuns) {
  auto g = ParseGraph(R"(
    graph @g(%x: f32[2,8]) {
      %a = Mul(%x, %x)
      %b = Relu(%a)
      %y = Softmax(%b) {axis = -1}
      return %y
    }
  )");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto target = MakeTarget("cpu", {.cpu = {.threads = 1}});
  ASSERT_TRUE(target.ok());
  ASSERT_TRUE(RunPipeline(**g, **target, {.fusion = {.enabled = false}}).ok());
  std::shared_ptr<const Graph> graph = std::move(*g);
  auto ex = (*target)->Compile(graph);
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  const ExecutableStats st = (*ex)->stats();
  EXPECT_EQ(st.launches, 3);
  EXPECT_EQ(st.launches, (*ex)->launches_per_run());
  EXPECT_GT(st.activation_bytes, 0);
  EXPECT_GE(st.activation_bytes_no_reuse, st.activation_bytes);
  EXPECT_EQ(st.device_bytes, 0);

  Tensor x = Tensor::Empty(DType::kF32, {2, 8}).value();
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = 0.25f * static_cast<float>(i % 7) - 0.6f;
  Tensor plain = Tensor::Empty(DType::kF32, {2, 8}).value(), observed = Tensor::Empty(DType::kF32, {2, 8}).value();
  const TensorView in[] = {x.view()};
  const TensorView out_plain[] = {plain.view()}, out_observed[] = {observed.view()};
  ASSERT_TRUE((*ex)->Run(in, out_plain).ok());
  std::vector<std::string> seen;
  float last_first = 0;
  ASSERT_TRUE((*ex)->RunObserved(in, out_observed,
                                 [&](const Node& n, std::span<const TensorView> ins, std::span<const TensorView> outs) {
                                   seen.push_back(std::string(op::Name(n.op_id())));
                                   last_first = static_cast<const float*>(outs[0].data)[0];
                                   return Status::Ok();
                                 })
                  .ok());
  EXPECT_EQ(seen, (std::vector<std::string>{"Mul", "Relu", "Softmax"}));
  EXPECT_EQ(last_first, observed.data_as<float>()[0]);
  EXPECT_EQ(std::memcmp(plain.data(), observed.data(), plain.nbytes()), 0);
  EXPECT_EQ((*ex)->DeviceRunMs(3).status().code(), StatusCode::kUnimplemented);
}

// CpuTargetOptions::gemm: each engine, forced, runs every GEMM against constant weights (as the
// target's DescribeKernels says), and each gives the float64 product within f32's rounding, at
// the rows where the rule takes the other one (4 rows: the own stream; 80 rows: oneDNN).
TEST(Target, TheCpuGemmEngineOptionForcesEachEngine) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  constexpr int64_t k = 96, n = 72;
  auto w = std::make_shared<Tensor>(Tensor::Empty(DType::kF32, {k, n}).value());
  for (int64_t i = 0; i < w->numel(); ++i) w->data_as<float>()[i] = u(rng);
  for (const int64_t m : {int64_t{4}, int64_t{80}}) {
    Tensor x = Tensor::Empty(DType::kF32, {m, k}).value();
    for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = u(rng);
    const TensorView in[] = {x.view()};
    for (const CpuGemmEngine engine :
         {CpuGemmEngine::kAuto, CpuGemmEngine::kRule, CpuGemmEngine::kOwn, CpuGemmEngine::kOneDnn}) {
      SCOPED_TRACE(StrCat("m ", m, ", engine ", static_cast<int>(engine)));
      auto g = std::make_shared<Graph>("gemm");
      Value* xv = g->AddInput("x", DType::kF32, {m, k}).value();
      Value* wv = g->AddConstant("w", w).value();
      ASSERT_TRUE(g->MarkOutput(g->AddNode("MatMul", {xv, wv}, {}, "mm", 1, {"y"}).value()->output()).ok());
      auto target = MakeTarget("cpu", {.cpu = {.threads = 2, .gemm = engine}});
      ASSERT_TRUE(target.ok()) << target.status().ToString();
      const std::vector<KernelChoice> choices = (*target)->DescribeKernels(*g);
      ASSERT_EQ(choices.size(), 1u);
      const bool forced = choices[0].how.find("as the target's options force") != std::string::npos;
      EXPECT_EQ(forced, engine == CpuGemmEngine::kOwn || engine == CpuGemmEngine::kOneDnn) << choices[0].how;
      // kRule says so; kAuto leaves weights this small (under kMinTunedWeights) to the rule too.
      if (engine == CpuGemmEngine::kRule)
        EXPECT_NE(choices[0].how.find("(the rule: --cpu-gemm rule)"), std::string::npos) << choices[0].how;
      if (engine == CpuGemmEngine::kAuto) EXPECT_NE(choices[0].how.find("not timed"), std::string::npos) << choices[0].how;
      if (engine == CpuGemmEngine::kOneDnn) EXPECT_NE(choices[0].how.find("oneDNN"), std::string::npos) << choices[0].how;
      if (engine == CpuGemmEngine::kOwn) EXPECT_NE(choices[0].how.find("own loops"), std::string::npos) << choices[0].how;
      auto ex = (*target)->Compile(g);
      ASSERT_TRUE(ex.ok()) << ex.status().ToString();
      Tensor y = Tensor::Empty(DType::kF32, {m, n}).value();
      const TensorView out[] = {y.view()};
      ASSERT_TRUE((*ex)->Run(in, out).ok());
      double worst = 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double ref = 0, mag = 0;
          for (int64_t p = 0; p < k; ++p) {
            const double t = double(x.data_as<float>()[i * k + p]) * double(w->data_as<float>()[p * n + j]);
            ref += t, mag += std::fabs(t);
          }
          worst = std::max(worst, std::fabs(double(y.data_as<float>()[i * n + j]) - ref) / mag);
        }
      EXPECT_LT(worst, 1e-5);  // k = 96 products, each rounded to f32: a few ulps of the sum of |terms|
    }
  }
}

}  // namespace
}  // namespace graphfuse
