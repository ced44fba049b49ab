// The pass manager (src/passes/pass_manager.h): every pass registered once, in pipeline order;
// the pipeline of a target leaves out the forms it does not run; RunPasses verifies, finishes,
// times and prints around each pass and refuses a pass name it does not know.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>

#include "cpu/cpu_target.h"
#include "ir/text.h"
#include "passes/pass_manager.h"
#include "passes/pipeline.h"

namespace graphfuse {
namespace {

constexpr const char* kChain = R"(graph @g(%x: f32[4,8]) {
  %a: f32[4,8] = Relu(%x)
  %b: f32[4,8] = Exp(%a)
  %dead: f32[4,8] = Neg(%x)
  return %b
})";

std::vector<std::string> Names(const std::vector<const Pass*>& passes) {
  std::vector<std::string> out;
  for (const Pass* p : passes) out.push_back(p->name);
  return out;
}

TEST(PassManager, EveryPassOnceAndThePipelineFollowsTheTargetAndTheOptions) {
  std::set<std::string> seen;
  for (const Pass& p : AllPasses()) {
    EXPECT_TRUE(seen.insert(p.name).second) << p.name << " registered twice";
    EXPECT_EQ(FindPass(p.name), &p);
    EXPECT_GT(std::string(p.what).size(), 10u) << p.name;
  }
  EXPECT_EQ(FindPass("NoSuchPass"), nullptr);
  const Target& cpu = cpu::DefaultCpuTarget();
  FusionReport report;
  PassContext fused{cpu, FusionOptionsFor(cpu, {}), report};
  const std::vector<std::string> all = Names(PipelineFor(fused));
  EXPECT_EQ(all.front(), "FoldConstants");
  EXPECT_EQ(all.back(), "FuseSiblingNorms");
  // The forms only some targets run leave the pipeline when the target or the user turns them off.
  FusionOptions no_forms;
  no_forms.attention_projection = false;
  no_forms.norm_into_gemm = false;
  PassContext plain{cpu, FusionOptionsFor(cpu, no_forms), report};
  const std::vector<std::string> some = Names(PipelineFor(plain));
  EXPECT_EQ(some.size() + 2, all.size());
  for (const char* name : {"FuseAttentionProjections", "FoldNormIntoGemm"})
    EXPECT_EQ(std::count(some.begin(), some.end(), name), 0) << name;
  // Fusion off: the unfused baseline runs only the passes that run always.
  FusionOptions off;
  off.enabled = false;
  PassContext baseline{cpu, FusionOptionsFor(cpu, off), report};
  EXPECT_EQ(Names(PipelineFor(baseline)), (std::vector<std::string>{"FoldConstants", "FuseElementwise"}));
}

TEST(PassManager, RunsFinishesTimesAndPrintsAroundEachPass) {
  auto g = ParseGraph(kChain);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Target& cpu = cpu::DefaultCpuTarget();
  FusionReport report;
  PassContext ctx{cpu, FusionOptionsFor(cpu, {}), report};
  const Pass* passes[] = {FindPass("FoldConstants"), FindPass("FuseElementwise")};
  char* text = nullptr;
  size_t size = 0;
  FILE* out = open_memstream(&text, &size);
  ASSERT_NE(out, nullptr);
  PassHooks hooks;
  hooks.print_to = out;
  hooks.print_ir_before = {"FuseElementwise"};
  hooks.print_ir_after = {"all"};
  auto records = RunPasses(**g, passes, ctx, hooks);
  std::fclose(out);
  const std::string printed(text, size);
  std::free(text);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  ASSERT_EQ(records->size(), 2u);
  EXPECT_EQ((*records)[0].pass, "FoldConstants");
  EXPECT_EQ((*records)[1].pass, "FuseElementwise");
  EXPECT_EQ((*records)[1].changes, 1);  // Relu and Exp, one group
  for (const PassRecord& r : *records) EXPECT_GE(r.ms, 0.0);
  EXPECT_EQ(report.groups.size(), 1u);
  // The dead Neg is gone after the first pass (the manager's finishing work).
  EXPECT_EQ(printed.find("// after FoldConstants"), 0u) << printed;
  EXPECT_EQ(printed.find("Neg"), std::string::npos) << printed;
  EXPECT_NE(printed.find("// before FuseElementwise"), std::string::npos);
  EXPECT_LT(printed.find("// before FuseElementwise"), printed.find("// after FuseElementwise"));
  EXPECT_EQ(printed.find("// before FoldConstants"), std::string::npos);
  EXPECT_NE(printed.find("FusedElementwise"), std::string::npos);

  PassHooks unknown;
  unknown.print_ir_after = {"FuseEverything"};
  auto refused = RunPasses(**g, passes, ctx, unknown);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("no pass named 'FuseEverything'"), std::string::npos);
  EXPECT_NE(refused.status().message().find("FuseGemm"), std::string::npos) << "the error lists the passes";
}

// A pass that fails is named in the error, and the passes after it do not run.
TEST(PassManager, AFailingPassIsNamed) {
  auto g = ParseGraph(kChain);
  ASSERT_TRUE(g.ok());
  const Target& cpu = cpu::DefaultCpuTarget();
  FusionReport report;
  PassContext ctx{cpu, FusionOptionsFor(cpu, {}), report};
  const Pass failing{"FailsOnPurpose", "returns an error", false, nullptr,
                     [](Graph&, PassContext&) -> Result<int> { return Internal("no rewrite here"); }};
  const Pass* passes[] = {&failing, FindPass("FuseElementwise")};
  auto r = RunPasses(**g, passes, ctx);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("FailsOnPurpose"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("no rewrite here"), std::string::npos) << r.status().ToString();
  EXPECT_TRUE(report.groups.empty()) << "FuseElementwise ran after a failed pass";
}

}  // namespace
}  // namespace graphfuse
