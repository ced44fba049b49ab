// Pass tests as files: each tests/passes/<Pass>/<case>.ir holds the IR before the pass, the
// passes to run (`# RUN: Pass [Pass ...]`, names as `graphfuse explain --passes` lists them)
// and `# CHECK...` lines (filecheck.h) the printed IR after them must satisfy. Every file is
// read twice: by the FileCheck runner (the rewrite itself: which nodes become what, their
// inputs, outputs and attributes) and by the numeric harness, which runs the graph before and
// after the passes on the same fresh random inputs and wants the same outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/cpu_target.h"
#include "cpu/executor.h"
#include "filecheck.h"
#include "graph_test_util.h"
#include "ir/text.h"
#include "passes/pass_manager.h"
#include "passes/pipeline.h"

namespace graphfuse {
namespace {

struct PassFile {
  std::string path, name;  // name: <Pass>_<case>, the test's name
  std::string text, checks;
  std::vector<std::string> passes;
};

std::vector<PassFile> ReadPassFiles() {
  std::vector<PassFile> files;
  const std::filesystem::path root = GF_PASSES_DIR;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.path().extension() != ".ir") continue;
    PassFile f;
    f.path = entry.path().string();
    f.name = entry.path().parent_path().filename().string() + "_" + entry.path().stem().string();
    std::ifstream in(entry.path());
    std::stringstream all;
    all << in.rdbuf();
    f.text = all.str();
    std::istringstream lines(f.text);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("# RUN:", 0) == 0) {
        std::istringstream names(line.substr(6));
        for (std::string n; names >> n;) f.passes.push_back(n);
      } else if (line.rfind("# CHECK", 0) == 0) {
        f.checks += line.substr(2) + "\n";
      }
    }
    files.push_back(std::move(f));
  }
  std::sort(files.begin(), files.end(), [](const PassFile& a, const PassFile& b) { return a.name < b.name; });
  return files;
}

// The file's graph after its passes, run by the pass manager on the CPU target with default
// options (as RunPipeline would, one pass at a time).
Result<std::unique_ptr<Graph>> RunFilePasses(const PassFile& f) {
  GF_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, ParseGraph(f.text));
  if (f.passes.empty()) return InvalidArgument(f.path, ": no '# RUN: Pass' line");
  std::vector<const Pass*> passes;
  for (const std::string& n : f.passes) {
    const Pass* p = FindPass(n);
    if (!p) return InvalidArgument(f.path, ": no pass named '", n, "'");
    passes.push_back(p);
  }
  const Target& cpu = cpu::DefaultCpuTarget();
  FusionReport report;
  PassContext ctx{cpu, FusionOptionsFor(cpu, {}), report};
  GF_RETURN_IF_ERROR(RunPasses(*g, passes, ctx).status());
  return g;
}

class PassFiles : public ::testing::TestWithParam<PassFile> {};

TEST_P(PassFiles, RewriteMatchesItsChecks) {
  const PassFile& f = GetParam();
  ASSERT_FALSE(f.checks.empty()) << f.path << ": no CHECK lines";
  auto g = RunFilePasses(f);
  ASSERT_TRUE(g.ok()) << f.path << ": " << g.status().ToString();
  const Status s = testing::FileCheck(PrintGraph(**g), f.checks);
  EXPECT_TRUE(s.ok()) << f.path << "\n" << s.message();
}

TEST_P(PassFiles, RewrittenGraphComputesWhatTheOriginalDoes) {
  const PassFile& f = GetParam();
  auto before = ParseGraph(f.text);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  auto after = RunFilePasses(f);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  const std::vector<Tensor> ins = FloatInputs(**before, 11);
  auto want = Execute(**before, Views(ins), CpuContext{});
  auto got = Execute(**after, Views(ins), CpuContext{});
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(want->size(), got->size());
  for (size_t i = 0; i < want->size(); ++i) {
    ASSERT_EQ((*want)[i].shape(), (*got)[i].shape()) << "output " << i;
    const double tol = 1e-5 + 1e-4 * MaxAbs((*want)[i]);
    EXPECT_LE(MaxAbsDiff((*got)[i], (*want)[i]), tol) << f.path << ": output " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Ir, PassFiles, ::testing::ValuesIn(ReadPassFiles()),
                         [](const ::testing::TestParamInfo<PassFile>& info) { return info.param.name; });

// The files are there to be read: a tree emptied by mistake fails here rather than passing.
TEST(PassFilesTree, HoldsCasesForEveryFusionPass) {
  std::set<std::string> covered;
  for (const PassFile& f : ReadPassFiles()) covered.insert(f.passes.begin(), f.passes.end());
  for (const char* pass : {"FoldConstants", "Canonicalize", "CanonicalizeViews", "FuseAttention", "FuseElementwise",
                           "FuseGemm", "FuseRowwise"})
    EXPECT_TRUE(covered.count(pass)) << "no file under tests/passes runs " << pass;
}

}  // namespace
}  // namespace graphfuse
