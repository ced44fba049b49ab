// The demo's transformer blocks with a KV cache (BlockConfig::past): one step over a cache is
// the same computation as the block without a cache over the whole sequence. The cache rows
// are the full block's own K (after RoPE) and V rows of the first `past` positions; the step's
// y must equal the full block's last `seq` rows of y, and its present rows the full block's K
// and V, for the unfused plan and for the fused plan (one FusedCachedAttention).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "cpu/cpu_target.h"
#include "cpu/executor.h"
#include "passes/pipeline.h"
#include "testing/blocks.h"

namespace graphfuse {
namespace {

Tensor Uniform(const Shape& s, uint32_t seed) {
  Tensor t = Tensor::Empty(DType::kF32, s).value();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = u(rng);
  return t;
}

// Rows [lo, hi) of axis `axis` of t.
Tensor Slice(const Tensor& t, int axis, int64_t lo, int64_t hi) {
  Shape s = t.shape();
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= s[i];
  for (size_t i = axis + 1; i < s.size(); ++i) inner *= s[i];
  const int64_t n = s[axis];
  s[axis] = hi - lo;
  Tensor r = Tensor::Empty(DType::kF32, s).value();
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(r.data_as<float>() + o * (hi - lo) * inner, t.data_as<float>() + (o * n + lo) * inner,
                static_cast<size_t>((hi - lo) * inner) * sizeof(float));
  return r;
}

double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double m = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a.data_as<float>()[i]) - b.data_as<float>()[i]));
  return m;
}

void StepMatchesFullSequence(const std::string& preset, int64_t past, int64_t seq) {
  ThreadPool pool(2);
  const CpuContext ctx{&pool};
  auto base = BlockPreset(preset);
  ASSERT_TRUE(base.ok());
  base->hidden = 64, base->heads = 4, base->ffn = 96;
  // The full block over past + seq positions, its K and V heads returned too.
  BlockConfig full = *base;
  full.seq = past + seq;
  auto wf = MakeBlockWeights(full, 3, ctx);
  ASSERT_TRUE(wf.ok()) << wf.status().ToString();
  Graph gf;
  ASSERT_TRUE(BuildBlock(gf, full, *wf).ok());
  const bool rope = base->family == BlockFamily::kLlama;
  for (const char* name : {rope ? "/attn/k/Rope" : "/attn/k/Transpose", "/attn/v/Transpose"}) {
    for (const auto& n : gf.nodes()) {
      if (n->name() == name) {
        ASSERT_TRUE(gf.MarkOutput(n->output()).ok());
      }
    }
  }
  ASSERT_EQ(gf.outputs().size(), 3u);
  PipelineOptions off;
  off.fusion.enabled = false;
  ASSERT_TRUE(RunPipeline(gf, cpu::DefaultCpuTarget(), off).ok());
  auto plan_full = ExecutionPlan::Compile(gf);
  ASSERT_TRUE(plan_full.ok());
  const Tensor x = Uniform({1, past + seq, base->hidden}, 17);
  const TensorView xin[] = {x.view()};
  auto want = (*plan_full)->Run(xin, ctx);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  // Outputs in marking order: y, then the K and V heads [1, heads, past + seq, head_dim].
  const Tensor& y_full = (*want)[0];
  const Tensor& k_full = (*want)[1];
  const Tensor& v_full = (*want)[2];

  BlockConfig step = *base;
  step.seq = seq, step.past = past;
  auto ws = MakeBlockWeights(step, 3, ctx);
  ASSERT_TRUE(ws.ok());
  const Tensor xs = Slice(x, 1, past, past + seq);
  const Tensor pk = Slice(k_full, 2, 0, past), pv = Slice(v_full, 2, 0, past);
  for (bool fuse : {false, true}) {
    Graph g;
    ASSERT_TRUE(BuildBlock(g, step, *ws).ok());
    ASSERT_EQ(g.inputs().size(), 3u);
    EXPECT_EQ(g.inputs()[1]->name(), "past_key");
    EXPECT_EQ(g.outputs()[1]->name(), "present_key");
    PipelineOptions o;
    o.fusion.enabled = fuse;
    ASSERT_TRUE(RunPipeline(g, cpu::DefaultCpuTarget(), o).ok());
    int cached = 0, concats = 0;
    for (const auto& n : g.nodes()) cached += n->op() == "FusedCachedAttention", concats += n->op() == "Concat";
    if (fuse) {
      EXPECT_TRUE(cached == 1 && concats == 0) << preset << ": the cache's append is not fused";
    }
    auto plan = ExecutionPlan::Compile(g);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    const TensorView in[] = {xs.view(), pk.view(), pv.view()};
    auto got = (*plan)->Run(in, ctx);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->size(), 3u);
    // Same arithmetic on the same rows, but GEMMs of other shapes: float32 rounding apart.
    EXPECT_LT(MaxAbsDiff((*got)[0], Slice(y_full, 1, past, past + seq)), 2e-5) << preset << " fused " << fuse;
    EXPECT_LT(MaxAbsDiff((*got)[1], k_full), 2e-5) << preset << " fused " << fuse;
    EXPECT_LT(MaxAbsDiff((*got)[2], v_full), 2e-5) << preset << " fused " << fuse;
  }
}

TEST(BlockCache, LlamaDecodeStepMatchesTheFullSequence) { StepMatchesFullSequence("llama-small", 7, 1); }
TEST(BlockCache, LlamaChunkMatchesTheFullSequence) { StepMatchesFullSequence("llama-small", 5, 3); }
TEST(BlockCache, Gpt2DecodeStepMatchesTheFullSequence) { StepMatchesFullSequence("gpt2", 6, 1); }

TEST(BlockCache, BertTakesNoCache) {
  auto c = BlockPreset("bert");
  ASSERT_TRUE(c.ok());
  c->past = 4;
  EXPECT_FALSE(MakeBlockWeights(*c, 1, CpuContext{}).ok());
}

}  // namespace
}  // namespace graphfuse
