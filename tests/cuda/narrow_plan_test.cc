// Whole models planned for the GPU in f16 and bf16 (ConvertPrecision with narrow inputs and
// outputs, as a serving stack runs them), run in host emulation: they fuse as the f32 plans do
// (the same launches: norms, softmax and attention over narrow tensors fuse on the CUDA target),
// every node has its GPU path, and the outputs agree with the CPU's f32 plan run on the same
// values within the README's tolerance for the dtype. The CPU's f32 plans are checked against
// float64 and torch in the model tests.
#include <gtest/gtest.h>

#include <filesystem>

#include "../graph_test_util.h"
#include "cpu/executor.h"
#include "cuda/cuda_executor.h"
#include "cuda/cuda_target.h"
#include "expect_close.h"
#include "narrow_twin.h"
#include "onnx/import.h"
#include "passes/convert_precision.h"
#include "passes/pipeline.h"

namespace graphfuse::cuda {
namespace {

// The README's accuracy contract for a model computing in dt (tools/compare.h NarrowTolerance).
double Tolerance(DType dt) { return dt == DType::kBF16 ? 5e-2 : 1e-2; }

struct EmulatedRun {
  std::vector<Tensor> outputs;
  CudaExecStats stats;
  std::string plan;
};

Result<EmulatedRun> RunEmulated(const Graph& g, const std::vector<TensorView>& inputs) {
  CudaExecOptions o;
  o.emulate = true;
  GF_ASSIGN_OR_RETURN(auto ex, CudaExecutor::Create(g, o));
  EmulatedRun r;
  GF_ASSIGN_OR_RETURN(r.outputs, ex->Run(inputs));
  r.stats = ex->stats();
  for (const std::string& l : ex->describe()) r.plan += l + "\n";
  return r;
}

TEST(CudaNarrowPlans, ModelsFuseAsInF32AndMatchTheCpu) {
  const std::filesystem::path models = std::filesystem::path(GF_MODELS_DIR);
  struct Case {
    const char* model;
    std::vector<DType> dtypes;
  } cases[] = {{"llama_block_opset17", {DType::kBF16, DType::kF16}},
               {"gpt2_block_opset17", {DType::kBF16, DType::kF16}},
               {"bert_layer_opset17", {DType::kBF16}},
               {"mlp_gelu_opset17", {DType::kBF16}}};
  for (const Case& c : cases) {
    const std::string path = (models / c.model / "model.onnx").string();
    auto f32 = ImportOnnxFile(path);
    ASSERT_TRUE(f32.ok()) << f32.status().ToString();
    const std::vector<Tensor> ins = RandomInputs(**f32, 61, 0.05, 1.0);
    for (DType dt : c.dtypes) {
      SCOPED_TRACE(StrCat(c.model, " in ", DTypeName(dt)));
      auto src = ImportOnnxFile(path);
      ASSERT_TRUE(src.ok());
      auto narrow = ConvertPrecision(**src, dt, {.narrow_io = true});
      ASSERT_TRUE(narrow.ok()) << narrow.status().ToString();
      ASSERT_TRUE(RunPipeline(**narrow, DefaultCudaTarget()).ok());
      auto wide = ImportOnnxFile(path);
      ASSERT_TRUE(wide.ok());
      ASSERT_TRUE(RunPipeline(**wide, DefaultCudaTarget()).ok());
      // The same values in both plans: the inputs rounded to dt, and those widened to f32.
      std::vector<Tensor> narrow_in, wide_in;
      for (const Tensor& t : ins) {
        narrow_in.push_back(IsFloat(t.dtype()) ? ConvertedTo(t, dt) : ConvertedTo(t, t.dtype()));
        wide_in.push_back(IsFloat(t.dtype()) ? ConvertedTo(narrow_in.back(), DType::kF32) : ConvertedTo(t, t.dtype()));
      }
      auto want = Execute(**wide, Views(wide_in), CpuContext{});
      ASSERT_TRUE(want.ok()) << want.status().ToString();
      auto got = RunEmulated(**narrow, Views(narrow_in));
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      auto f32_plan = RunEmulated(**wide, Views(wide_in));
      ASSERT_TRUE(f32_plan.ok()) << f32_plan.status().ToString();
      EXPECT_EQ(got->stats.host_fallbacks, 0) << got->plan;
      EXPECT_EQ(got->stats.launches, f32_plan->stats.launches) << "narrow plan:\n"
                                                                << got->plan << "f32 plan:\n"
                                                                << f32_plan->plan;
      ASSERT_EQ(got->outputs.size(), want->size());
      for (size_t k = 0; k < want->size(); ++k) {
        EXPECT_EQ(got->outputs[k].dtype(), dt);
        const double worst =
            ExpectClose(got->outputs[k], (*want)[k], Tolerance(dt), Tolerance(dt), StrCat("output ", k));
        std::printf("[ emulated ] %s %s: %lld launches (f32: %lld); output %zu max |err| vs the CPU's f32 %.3g\n",
                    c.model, DTypeName(dt), static_cast<long long>(got->stats.launches),
                    static_cast<long long>(f32_plan->stats.launches), k, worst);
      }
    }
  }
}

}  // namespace
}  // namespace graphfuse::cuda
