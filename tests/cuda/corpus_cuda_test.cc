// The transformers corpus (tests/models/hf) on the CUDA target through the public API: a plan
// per input signature, against torch's outputs (rtol 1e-3, atol 1e-4; the undefined rows of
// padded query positions left out, see BlankPaddedRows). With GPU 0 every model
// and data set runs on it; without one, a model of each kind runs its first data set in host
// emulation (generated kernels compiled as C++), which checks the plans but is slow.
#include <gtest/gtest.h>

#include <filesystem>

#include "../onnx/onnx_test_util.h"
#include "cuda/cuda_executor.h"
#include "graphfuse/model.h"

namespace graphfuse::testing {
namespace {

const std::filesystem::path kCorpus = std::filesystem::path(GF_MODELS_DIR) / "hf";

// Without a GPU: a decoder with a KV cache, grouped-query attention from the dynamo exporter, a
// dynamic GPT-2, an encoder, the default (sdpa) export at opset 23 (ONNX's Attention and
// RotaryEmbedding, a cache, grouped-query heads, weights in model.onnx.data), and Gemma 2 (its
// soft-capped attention, which no generated kernel takes, runs its reference graph).
const char* const kEmulated[] = {"llama_ts_kv", "llama_gqa_dynamo_dynamic", "gpt2_ts_dynamic", "bert_ts_dynamic",
                                 "llama_gqa_sdpa_dynamo23_kv", "gemma2_sdpa_dynamo_kv"};

TEST(CudaCorpus, ExportedModelsMatchTorch) {
  const bool gpu = cuda::CudaDeviceAvailable(0);
  auto target = MakeTarget("cuda", {.cuda = {.emulate = !gpu}});
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  const std::shared_ptr<const Target> cuda = std::move(*target);
  std::vector<std::string> dirs;
  if (gpu) {
    for (const auto& e : std::filesystem::directory_iterator(kCorpus))
      if (std::filesystem::exists(e.path() / "model.onnx")) dirs.push_back(e.path().filename().string());
    std::sort(dirs.begin(), dirs.end());
  } else {
    dirs.assign(std::begin(kEmulated), std::end(kEmulated));
  }
  ASSERT_FALSE(dirs.empty());
  for (const std::string& name : dirs) {
    SCOPED_TRACE(name);
    const std::string dir = (kCorpus / name).string();
    auto model = Model::FromOnnxFile(dir + "/model.onnx");
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    auto compiled = CompiledModel::Compile(std::move(*model), cuda);
    ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
    const std::vector<TensorInfo>& decls = (*compiled)->inputs();
    std::vector<std::string> sets = DataSets(dir);
    if (!gpu) sets.resize(1);
    for (const std::string& set : sets) {
      SCOPED_TRACE(set);
      std::vector<std::string> names;
      for (const TensorInfo& d : decls) names.push_back(d.name);
      auto inputs = ReadDataSetInputs(set, names);
      ASSERT_TRUE(inputs.ok()) << inputs.status().ToString();
      std::vector<TensorView> views;
      for (const Tensor& t : *inputs) views.push_back(t.view());
      auto outs = (*compiled)->Run(views);
      ASSERT_TRUE(outs.ok()) << outs.status().ToString();
      const auto refs = NumberedFiles(set, "output_");
      ASSERT_EQ(refs.size(), outs->size());
      for (size_t k = 0; k < refs.size(); ++k) {
        auto ref = ReadTensorProtoFile(refs[k]);
        ASSERT_TRUE(ref.ok());
        const Tensor* mask = nullptr;
        for (size_t i = 0; i < names.size(); ++i)
          if (names[i] == "attention_mask") mask = &(*inputs)[i];
        const Comparison c =
            CompareDefinedRows((*outs)[k], *ref, (*compiled)->plan()->outputs()[k].name, mask, Tolerance{1e-3, 1e-4});
        EXPECT_TRUE(c.ok) << "output " << k << ": " << c.detail;
      }
    }
  }
}

}  // namespace
}  // namespace graphfuse::testing
