// Generated CUDA kernels take the sizes that follow the inputs' shapes as parameters: a model
// with symbolic dims, planned for one input signature after another, compiles its kernels for
// the first prompt and the first decode step, and every later length of either finds them in
// the target's kernel cache. Run in host emulation (one shared object per kernel compiled),
// with every run's outputs against the CPU target's.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <random>

#include "cuda/cuda_target.h"
#include "cuda/kernel_cache.h"
#include "graphfuse/model.h"
#include "graphfuse/target.h"

namespace graphfuse::cuda {
namespace {

constexpr int64_t kHeads = 4, kHeadDim = 16;  // the corpus's small LLaMA (tests/models/hf)

Tensor Filled(DType dt, const Shape& shape, const std::function<double(int64_t)>& value) {
  Tensor t = Tensor::Empty(dt, shape).value();
  for (int64_t i = 0; i < t.numel(); ++i) t.SetFromDouble(i, value(i));
  return t;
}

// `seq` new tokens after `past` cached rows: ids, an all-ones attention mask, positions after
// the past, and random cache rows for each of the two layers' K and V.
std::vector<Tensor> LlamaInputs(int64_t past, int64_t seq, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<Tensor> in;
  in.push_back(Filled(DType::kI64, {1, seq}, [&](int64_t i) { return static_cast<double>((i * 37 + seed) % 150); }));
  in.push_back(Filled(DType::kI64, {1, past + seq}, [](int64_t) { return 1.0; }));
  in.push_back(Filled(DType::kI64, {1, seq}, [&](int64_t i) { return static_cast<double>(past + i); }));
  for (int k = 0; k < 4; ++k)
    in.push_back(Filled(DType::kF32, {1, kHeads, past, kHeadDim}, [&](int64_t) { return uniform(rng); }));
  return in;
}

// max |got - want| / (1 + |want|), NaN counting as infinite.
double WorstRelative(const Tensor& got, const Tensor& want) {
  double worst = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double w = want.GetAsDouble(i), e = std::fabs(got.GetAsDouble(i) - w) / (1 + std::fabs(w));
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst;
}

// After the first prompt and the first decode step, prompts and decode steps of other lengths
// compile no kernel (a prompt's length decides its attention's form: every prompt here has
// more query rows than CudaPlanOptions::attention_rows_one_kernel, so all take the flash kernel).
TEST(CudaShapeClasses, NewLengthsCompileNoKernelAfterTheFirstPromptAndDecodeStep) {
  const std::string path = std::string(GF_MODELS_DIR) + "/hf/llama_ts_kv/model.onnx";
  auto cuda = std::make_shared<const CudaTarget>(CudaTargetOptions{.emulate = true});
  auto cpu_target = MakeTarget("cpu", {.cpu = {.threads = 2}});
  ASSERT_TRUE(cpu_target.ok()) << cpu_target.status().ToString();
  const std::shared_ptr<const Target> cpu = std::move(*cpu_target);
  auto on_cuda = CompiledModel::Compile(Model::FromOnnxFile(path).value(), cuda);
  auto on_cpu = CompiledModel::Compile(Model::FromOnnxFile(path).value(), cpu);
  ASSERT_TRUE(on_cuda.ok()) << on_cuda.status().ToString();
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status().ToString();

  // Runs both models on the inputs; returns the kernels the CUDA target has compiled so far.
  auto run = [&](int64_t past, int64_t seq) -> int64_t {
    const std::string what = StrCat(seq, " new tokens on ", past, " cached rows");
    const std::vector<Tensor> in = LlamaInputs(past, seq, static_cast<uint32_t>(past * 131 + seq));
    std::vector<TensorView> views;
    for (const Tensor& t : in) views.push_back(t.view());
    auto got = (*on_cuda)->Run(views);
    auto want = (*on_cpu)->Run(views);
    EXPECT_TRUE(got.ok()) << what << ": " << got.status().ToString();
    EXPECT_TRUE(want.ok()) << what << ": " << want.status().ToString();
    if (got.ok() && want.ok()) {
      EXPECT_EQ(got->size(), want->size()) << what;
      for (size_t o = 0; o < std::min(got->size(), want->size()); ++o) {
        EXPECT_EQ((*got)[o].shape(), (*want)[o].shape()) << what << ", output " << o;
        if ((*got)[o].shape() == (*want)[o].shape()) {
          EXPECT_LT(WorstRelative((*got)[o], (*want)[o]), 1e-5) << what << ", output " << o << " against the CPU";
        }
      }
    }
    const int64_t compiled = cuda->kernel_cache().kernels_compiled();
    std::printf("[ emulated ] %s: %lld kernels compiled so far\n", what.c_str(), static_cast<long long>(compiled));
    return compiled;
  };

  const int64_t first_prompt = run(0, 18);
  EXPECT_GT(first_prompt, 0);
  const int64_t first_step = run(18, 1);
  EXPECT_GT(first_step, first_prompt) << "a decode step runs kernels a prompt does not (the cached attention's)";
  for (int64_t seq : {17, 21, 30, 25})
    EXPECT_EQ(run(0, seq), first_step) << "a prompt of " << seq << " tokens compiled kernels";
  for (int64_t past : {19, 20, 33, 47, 70, 21})
    EXPECT_EQ(run(past, 1), first_step) << "a decode step on " << past << " cached rows compiled kernels";
  // Every length had a plan of its own, made at its call or ahead of it: the first prompt and
  // the first decode step each planned their class's next two lengths, of which the decode
  // steps on 19 and 20 cached rows found theirs.
  const PlanCacheStats stats = (*on_cuda)->cache_stats();
  EXPECT_EQ(stats.plans_ahead, 4);
  EXPECT_EQ(stats.hits, 2);
  EXPECT_EQ(stats.plans_made, 12 - 2);
}

}  // namespace
}  // namespace graphfuse::cuda
