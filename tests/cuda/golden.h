// The golden CUDA sources under tests/golden: each generated kernel's source without the device
// prelude that every one of them starts with (src/cuda/device_prelude.h), which is kept once as
// prelude.cuh. GF_UPDATE_GOLDEN=1 rewrites the files instead of comparing; review the diff.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cuda/device_prelude.h"

namespace graphfuse::cuda {

inline bool UpdateGolden() {
  const char* e = std::getenv("GF_UPDATE_GOLDEN");
  return e && std::string(e) == "1";
}

// Compares `text` with tests/golden/`file` byte for byte (or writes it there under
// GF_UPDATE_GOLDEN=1).
inline void ExpectGoldenFile(const std::string& file, const std::string& text) {
  const std::filesystem::path path = std::filesystem::path(GF_GOLDEN_DIR) / file;
  if (UpdateGolden()) {
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << text;
    return;
  }
  std::ifstream f(path, std::ios::binary);
  ASSERT_TRUE(f.good()) << path << " is missing; run with GF_UPDATE_GOLDEN=1 to create it";
  std::stringstream want;
  want << f.rdbuf();
  EXPECT_EQ(text, want.str()) << "generated source differs from " << path
                              << "; if intended, rerun with GF_UPDATE_GOLDEN=1 and review the diff";
}

// A kernel's source against tests/golden/`name`.cu, the prelude it starts with left out.
inline void ExpectGoldenSource(const std::string& name, const std::string& source) {
  const std::string prelude = kDevicePrelude;
  ASSERT_EQ(source.compare(0, prelude.size(), prelude), 0)
      << "the source of '" << name << "' does not start with the device prelude";
  ExpectGoldenFile(name + ".cu", source.substr(prelude.size()));
}

}  // namespace graphfuse::cuda
