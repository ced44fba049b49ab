// The embeddable API (graphfuse/model.h): compile for a target, run from several threads at
// once, recover from a failing call.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <thread>

#include "graphfuse/model.h"
#include "graphfuse/profiling.h"
#include "graphfuse/thread_pool.h"
#include "testing/blocks.h"
#include "test_util.h"

namespace graphfuse {
namespace {

// A small LLaMA block as a Model (built with the graph API).
Model SmallLlama(const BlockWeights& w, const BlockConfig& cfg) {
  auto g = std::make_unique<Graph>("llama");
  EXPECT_TRUE(BuildBlock(*g, cfg, w).ok());
  auto m = Model::FromGraph(std::move(g));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(*m);
}

struct Fixture {
  BlockConfig cfg;
  BlockWeights weights;
};

Fixture MakeFixture() {
  ThreadPool pool(2);
  auto cfg = BlockPreset("llama-small");
  EXPECT_TRUE(cfg.ok());
  cfg->seq = 12, cfg->batch = 1, cfg->hidden = 64, cfg->heads = 4, cfg->ffn = 96;
  auto w = MakeBlockWeights(*cfg, 9, CpuContext{&pool});
  EXPECT_TRUE(w.ok());
  return {*cfg, std::move(*w)};
}

Tensor Input(const BlockConfig& cfg, uint32_t seed) {
  Tensor t = Tensor::Empty(DType::kF32, {cfg.batch, cfg.seq, cfg.hidden}).value();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.SetFromDouble(i, u(rng));
  return t;
}

// The small block compiled, fused, for a CPU target of 2 threads (nullptr after a failure).
std::unique_ptr<CompiledModel> CompileOnTwoThreads(const Fixture& f) {
  auto target = MakeTarget("cpu", {.cpu = {.threads = 2}});
  EXPECT_TRUE(target.ok()) << target.status().ToString();
  if (!target.ok()) return nullptr;
  auto model = CompiledModel::Compile(SmallLlama(f.weights, f.cfg), std::move(*target));
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? std::move(*model) : nullptr;
}

TEST(ModelApi, CompilesFusedAndUnfusedAndTheyAgree) {
  const Fixture f = MakeFixture();
  auto target = MakeTarget("cpu", {.cpu = {.threads = 2}});
  ASSERT_TRUE(target.ok());
  CompileOptions unfused_options;
  unfused_options.fusion.enabled = false;
  std::shared_ptr<const Target> cpu = std::move(*target);
  auto fused = CompiledModel::Compile(SmallLlama(f.weights, f.cfg), cpu);
  auto unfused = CompiledModel::Compile(SmallLlama(f.weights, f.cfg), cpu, unfused_options);
  ASSERT_TRUE(fused.ok()) << fused.status().ToString();
  ASSERT_TRUE(unfused.ok()) << unfused.status().ToString();
  EXPECT_LT((*fused)->plan()->launches_per_run(), (*unfused)->plan()->launches_per_run());
  EXPECT_EQ((*fused)->plan()->report().kernels_after, (*fused)->plan()->launches_per_run());
  EXPECT_FALSE((*fused)->plan()->report().groups.empty());
  ASSERT_EQ((*fused)->inputs().size(), 1u);
  EXPECT_EQ((*fused)->inputs()[0].name, "x");
  EXPECT_EQ((*fused)->outputs()[0].shape, (Shape{1, 12, 64}));

  const Tensor x = Input(f.cfg, 1);
  const TensorView in[] = {x.view()};
  auto yf = (*fused)->Run(in);
  auto yu = (*unfused)->Run(in);
  ASSERT_TRUE(yf.ok() && yu.ok());
  double peak = 0, err = 0;
  for (int64_t i = 0; i < yu->at(0).numel(); ++i) {
    peak = std::max(peak, std::fabs(yu->at(0).GetAsDouble(i)));
    err = std::max(err, std::fabs(yu->at(0).GetAsDouble(i) - yf->at(0).GetAsDouble(i)));
  }
  EXPECT_GT(peak, 0.1);
  EXPECT_LT(err, 1e-4 * (1 + peak));
}

// 8 threads run one compiled model at once, each on its own inputs, many times: every result is
// the one a single-threaded run gives for those inputs, bit for bit.
TEST(ModelApi, EightThreadsRunOneModel) {
  const Fixture f = MakeFixture();
  std::unique_ptr<CompiledModel> model = CompileOnTwoThreads(f);
  ASSERT_NE(model, nullptr);
  const CompiledModel& m = *model;

  constexpr int kThreads = 8, kRuns = 12;
  std::vector<Tensor> inputs, expected;
  for (int t = 0; t < kThreads; ++t) {
    inputs.push_back(Input(f.cfg, 100 + t));
    const TensorView in[] = {inputs.back().view()};
    auto y = m.Run(in);
    ASSERT_TRUE(y.ok());
    expected.push_back(std::move(y->at(0)));
  }
  std::vector<int> mismatches(kThreads, 0), failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      Tensor out = Tensor::Empty(DType::kF32, m.outputs()[0].shape).value();
      for (int r = 0; r < kRuns; ++r) {
        std::memset(out.data(), 0xff, out.nbytes());  // NaNs: a run that writes nothing shows
        const TensorView in[] = {inputs[t].view()};
        const TensorView o[] = {out.view()};
        if (!m.Run(in, o).ok()) {
          ++failures[t];
          continue;
        }
        if (std::memcmp(out.data(), expected[t].data(), out.nbytes()) != 0) ++mismatches[t];
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[t], 0) << "thread " << t;
    EXPECT_EQ(mismatches[t], 0) << "thread " << t;
  }
}

// A traced run gives the same outputs as an untraced one, and records one "run" event and one
// event per kernel of the plan, each named by its node with its op, bytes and engine, a fused
// kernel with its members; the kernels lie inside their run.
TEST(ModelApi, TracedRunsRecordEveryKernelOfThePlan) {
  const Fixture f = MakeFixture();
  std::unique_ptr<CompiledModel> model = CompileOnTwoThreads(f);
  ASSERT_NE(model, nullptr);
  const CompiledModel& m = *model;
  const Tensor x = Input(f.cfg, 3);
  const TensorView in[] = {x.view()};
  auto plain = m.Run(in);
  ASSERT_TRUE(plain.ok());
  TraceRecorder trace;
  for (int r = 0; r < 2; ++r) {
    auto traced = m.Run(in, &trace);
    ASSERT_TRUE(traced.ok()) << traced.status().ToString();
    EXPECT_EQ(std::memcmp(traced->at(0).data(), plain->at(0).data(), plain->at(0).nbytes()), 0);
  }
  const Plan& plan = *m.plan();
  EXPECT_EQ(trace.events(), 2 * (1 + plan.launches_per_run()));  // a static model plans at Compile
  const std::string json = trace.ToJson();
  EXPECT_EQ(json.rfind("{\"traceEvents\": [", 0), 0u) << json.substr(0, 80);
  auto count = [&](const std::string& needle) {
    int64_t n = 0;
    for (size_t at = json.find(needle); at != std::string::npos; at = json.find(needle, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("\"cat\": \"run\""), 2);
  EXPECT_EQ(count("\"engine\": "), 2 * plan.launches_per_run());
  EXPECT_EQ(count("\"bytes\": "), 2 * plan.launches_per_run());
  ASSERT_FALSE(plan.report().groups.empty());
  for (const FusedGroupInfo& g : plan.report().groups) {
    EXPECT_EQ(count(StrCat("\"name\": \"", g.name, "\"")), 2) << g.name;
    EXPECT_GE(count(StrCat("\"", g.nodes.front(), "\"")), 2) << g.name << ": its first member";
  }
  ASSERT_FALSE(plan.kernel_choices().empty());  // the block's GEMMs
  for (const KernelChoice& c : plan.kernel_choices()) EXPECT_GE(count(StrCat("\"engine\": \"", c.how, "\"")), 2) << c.node;
  EXPECT_EQ(count("\"ph\": \"X\""), trace.events());
  // Written and cleared: the file holds the same document; a path that cannot be written is refused
  // naming it.
  const std::string path = ::testing::TempDir() + "/trace.json";
  ASSERT_TRUE(trace.WriteFile(path).ok());
  FILE* fp = std::fopen(path.c_str(), "r");
  ASSERT_NE(fp, nullptr);
  std::string text(json.size() + 1, '\0');
  EXPECT_EQ(std::fread(text.data(), 1, text.size(), fp), json.size() + 1);
  std::fclose(fp);
  EXPECT_EQ(text, json + "\n");
  const Status bad = trace.WriteFile("/nonexistent-dir/trace.json");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("/nonexistent-dir/trace.json"), std::string::npos);
  trace.Clear();
  EXPECT_EQ(trace.events(), 0);
}

// CompileOptions::dtype is one option for every target, run as the target runs that dtype: the
// CPU holds its GEMM weights in bf16, the CUDA target (emulated on the host) converts the model.
// Both stay within bf16's tolerance of the f32 plan, the outputs keep the model's types, and a
// dtype a target does not run is refused naming it.
TEST(ModelApi, OneDtypeOptionForEveryTarget) {
  const Fixture f = MakeFixture();
  const Tensor x = Input(f.cfg, 4);
  const TensorView in[] = {x.view()};
  for (const std::string& name : TargetNames()) {
    SCOPED_TRACE(name);
    // Each target its own options (a target refuses another's): the CUDA target emulated.
    TargetOptions options{.cpu = {.threads = 2}};
    options.cuda.emulate = name == "cuda";
    auto target = MakeTarget(name, options);
    ASSERT_TRUE(target.ok()) << target.status().ToString();
    std::shared_ptr<const Target> t = std::move(*target);
    CompileOptions bf16;
    bf16.dtype = DType::kBF16;
    auto exact = CompiledModel::Compile(SmallLlama(f.weights, f.cfg), t);
    auto narrow = CompiledModel::Compile(SmallLlama(f.weights, f.cfg), t, bf16);
    ASSERT_TRUE(exact.ok() && narrow.ok()) << (narrow.ok() ? exact.status() : narrow.status()).ToString();
    auto want = (*exact)->Run(in);
    auto got = (*narrow)->Run(in);
    ASSERT_TRUE(want.ok() && got.ok()) << (got.ok() ? want.status() : got.status()).ToString();
    ASSERT_EQ(got->at(0).dtype(), DType::kF32);
    double peak = 0, err = 0;
    for (int64_t i = 0; i < want->at(0).numel(); ++i) {
      peak = std::max(peak, std::fabs(want->at(0).GetAsDouble(i)));
      err = std::max(err, std::fabs(want->at(0).GetAsDouble(i) - got->at(0).GetAsDouble(i)));
    }
    EXPECT_GT(err, 0.0) << "bf16 gave the f32 plan's bits: the option did nothing";
    EXPECT_LT(err, 5e-2 * (1 + peak));
    if (name == "cpu") {
      bool bf16_weights = false;
      for (const KernelChoice& c : (*narrow)->plan()->kernel_choices()) bf16_weights |= c.how.find("bf16 weights") != std::string::npos;
      EXPECT_TRUE(bf16_weights) << "the CPU's bf16 is its GEMMs' weights";
      CompileOptions f16;
      f16.dtype = DType::kF16;
      auto refused = CompiledModel::Compile(SmallLlama(f.weights, f.cfg), t, f16);
      ASSERT_FALSE(refused.ok());
      EXPECT_EQ(refused.status().code(), StatusCode::kUnimplemented);
      EXPECT_NE(refused.status().message().find("f16 needs the cuda target"), std::string::npos)
          << refused.status().ToString();
    }
  }
}

// A call with wrong inputs fails with InvalidArgument naming the input; the next call works.
TEST(ModelApi, AFailingCallLeavesTheModelUsable) {
  const Fixture f = MakeFixture();
  auto target = MakeTarget("cpu");
  ASSERT_TRUE(target.ok());
  auto model = CompiledModel::Compile(SmallLlama(f.weights, f.cfg), std::move(*target));
  ASSERT_TRUE(model.ok());
  const Tensor x = Input(f.cfg, 7);
  const TensorView good[] = {x.view()};
  auto want = (*model)->Run(good);
  ASSERT_TRUE(want.ok());

  const Tensor wrong = Tensor::Empty(DType::kF32, {1, 5, 64}).value();
  const TensorView bad[] = {wrong.view()};
  auto r = (*model)->Run(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'x'"), std::string::npos) << r.status().ToString();
  EXPECT_FALSE((*model)->Run(std::span<const TensorView>{}).ok()) << "no inputs";

  auto again = (*model)->Run(good);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(std::memcmp(again->at(0).data(), want->at(0).data(), want->at(0).nbytes()), 0);
}

// Compiling and running a model with GEMMs (oneDNN's sgemm and packed weights, the own loops)
// and attention leaves the process's settings as the program set them: OpenMP's thread count.
TEST(ModelApi, LeavesProcessSettingsAlone) {
  omp_set_num_threads(3);
  const Fixture f = MakeFixture();
  auto target = MakeTarget("cpu", {.cpu = {.threads = 2}});
  ASSERT_TRUE(target.ok());
  auto model = CompiledModel::Compile(SmallLlama(f.weights, f.cfg), std::move(*target));
  ASSERT_TRUE(model.ok());
  const Tensor x = Input(f.cfg, 3);
  const TensorView in[] = {x.view()};
  ASSERT_TRUE((*model)->Run(in).ok());
  EXPECT_EQ(omp_get_max_threads(), 3);
}

TEST(ModelApi, FromGraphVerifiesAndFromOnnxBytesRejectsGarbage) {
  EXPECT_FALSE(Model::FromGraph(nullptr).ok());
  auto bad = Model::FromOnnxBytes("not a model", "garbage.onnx");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("garbage.onnx"), std::string::npos) << bad.status().ToString();
}

}  // namespace
}  // namespace graphfuse
