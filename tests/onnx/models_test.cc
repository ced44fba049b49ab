// End-to-end: every tests/models/*/ (exported by tools/export_models.py from PyTorch, with
// float64 references) through ImportOnnxFile + Execute, outputs within 1e-4 (abs and rel).
// Prints the kernel count and peak activation bytes per model.
//
// The models directory is GF_MODELS_DIR (set by CMake), overridable by $GF_MODELS_DIR.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "graphfuse/thread_pool.h"
#include "onnx_test_util.h"

namespace graphfuse::testing {
namespace {

std::string ModelsDir() {
  if (const char* p = std::getenv("GF_MODELS_DIR")) return p;
#ifdef GF_MODELS_DIR
  return GF_MODELS_DIR;
#else
  return "tests/models";
#endif
}

std::vector<std::string> ModelDirs() {
  std::vector<std::string> dirs;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(ModelsDir(), ec))
    if (e.is_directory() && std::filesystem::exists(e.path() / "model.onnx")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

TEST(OnnxModels, ExportedModelsMatchFloat64Reference) {
  const auto dirs = ModelDirs();
  ASSERT_FALSE(dirs.empty()) << "no models in " << ModelsDir() << " (run tools/export_models.py)";
  ThreadPool pool(2);
  CpuContext ctx{&pool};
  std::printf("%-32s %16s %14s %12s %12s\n", "model", "kernels unf->fus", "peak_act_bytes", "max_abs_err",
              "max_rel_err");
  for (const std::string& dir : dirs) {
    const std::string name = std::filesystem::path(dir).filename().string();
    const DirResult r = RunOnnxTestDir(dir, ctx, [](DType) { return Tolerance{1e-4, 1e-4}; });
    EXPECT_EQ(r.outcome, Outcome::kPass) << name << ": " << r.reason;
    EXPECT_LT(r.kernels_fused, r.kernels_unfused) << name << ": fusion should cut the kernel count";
    const std::string kernels = StrCat(r.kernels_unfused, " -> ", r.kernels_fused);
    std::printf("%-32s %16s %14lld %12.3g %12.3g\n", name.c_str(), kernels.c_str(),
                static_cast<long long>(r.stats.peak_activation_bytes), r.max_abs_err, r.max_rel_err);
  }
}

}  // namespace
}  // namespace graphfuse::testing
