// FuseAttentionCache: a decoder's attention over a KV cache as transformers exports it (the new
// K / V rows head-split, K roped, appended to the past rows by Concat, the present rows returned
// as graph outputs, K / V repeated for grouped-query heads) -> one FusedCachedAttention that
// writes the attention's output and the present rows. Fused against the unfused graph on random
// inputs, for decode (one new row) and a chunk (3 new rows) on a past, GQA and MHA, with and
// without RoPE; the node against its reference graph; what stays apart and why.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "cpu/cpu_target.h"
#include "cpu/executor.h"
#include "graph_test_util.h"
#include "graphfuse/thread_pool.h"
#include "ir/text.h"
#include "passes/fusion_passes.h"
#include "passes/pipeline.h"

namespace graphfuse {
namespace {

struct CacheSpec {
  int64_t b = 2, h = 4, kv = 4, past = 5, s = 1, d = 8;
  bool rope = true;
  bool k_own_tables = false;  // K ropes with tables of its own (not Q's): the Rope stays apart
};

std::string Ints(std::initializer_list<int64_t> v) {
  std::string s;
  for (int64_t x : v) s += StrCat(s.empty() ? "" : ", ", x);
  return s;
}

// The decoder's attention as text: q [B,S,H*d], k / v [B,S,KV*d], the past rows [B,KV,P,d], a
// constant causal mask over the P+S keys (query row i sees keys up to P+i), returning the
// output [B,S,H*d] and the present K and V rows.
std::string DecoderText(const CacheSpec& c) {
  const int64_t sk = c.past + c.s, r = c.h / c.kv;
  std::string mask;
  for (int64_t i = 0; i < c.s; ++i)
    for (int64_t j = 0; j < sk; ++j)
      mask += StrCat(mask.empty() ? "" : ", ", j > c.past + i ? -3.40282347e+38 : 0.0);
  std::string t = StrCat("graph @kv(%q: f32[", Ints({c.b, c.s, c.h * c.d}), "], %k: f32[", Ints({c.b, c.s, c.kv * c.d}),
                         "], %v: f32[", Ints({c.b, c.s, c.kv * c.d}), "], %past_k: f32[",
                         Ints({c.b, c.kv, c.past, c.d}), "], %past_v: f32[", Ints({c.b, c.kv, c.past, c.d}), "]");
  if (c.rope) t += StrCat(", %cos: f32[", Ints({c.b, 1, c.s, c.d}), "], %sin: f32[", Ints({c.b, 1, c.s, c.d}), "]");
  if (c.k_own_tables)
    t += StrCat(", %kcos: f32[", Ints({c.b, 1, c.s, c.d}), "], %ksin: f32[", Ints({c.b, 1, c.s, c.d}), "]");
  t += ") {\n";
  t += StrCat("  %qs: i64[4] = const [", Ints({c.b, c.s, c.h, c.d}), "]\n");
  t += StrCat("  %ks: i64[4] = const [", Ints({c.b, c.s, c.kv, c.d}), "]\n");
  t += StrCat("  %os: i64[3] = const [", Ints({c.b, c.s, c.h * c.d}), "]\n");
  t += StrCat("  %mask: f32[1,1,", c.s, ",", sk, "] = const [", mask, "]\n");
  t += "  %c: f32[] = const [0.35355339]\n";
  t += "  %qr = Reshape(%q, %qs)\n  %q4 = Transpose(%qr) {perm = [0, 2, 1, 3]}\n";
  t += "  %kr = Reshape(%k, %ks)\n  %k4 = Transpose(%kr) {perm = [0, 2, 1, 3]}\n";
  t += "  %vr = Reshape(%v, %ks)\n  %v4 = Transpose(%vr) {perm = [0, 2, 1, 3]}\n";
  std::string q = "%q4", k = "%k4";
  if (c.rope) {
    t += "  %qe = Rope(%q4, %cos, %sin)\n";
    t += c.k_own_tables ? "  %ke = Rope(%k4, %kcos, %ksin)\n" : "  %ke = Rope(%k4, %cos, %sin)\n";
    q = "%qe", k = "%ke";
  }
  t += StrCat("  %present_k = Concat(%past_k, ", k, ") {axis = -2}\n");
  t += "  %present_v = Concat(%past_v, %v4) {axis = -2}\n";
  std::string kh = "%present_k", vh = "%present_v";
  if (r > 1) {  // transformers' repeat_kv
    t += "  %ax: i64[1] = const [2]\n";
    t += StrCat("  %ex: i64[5] = const [", Ints({c.b, c.kv, r, sk, c.d}), "]\n");
    t += StrCat("  %rs: i64[4] = const [", Ints({c.b, c.h, sk, c.d}), "]\n");
    t += "  %ku = Unsqueeze(%present_k, %ax)\n  %kx = Expand(%ku, %ex)\n  %kh = Reshape(%kx, %rs)\n";
    t += "  %vu = Unsqueeze(%present_v, %ax)\n  %vx = Expand(%vu, %ex)\n  %vh = Reshape(%vx, %rs)\n";
    kh = "%kh", vh = "%vh";
  }
  t += StrCat("  %kt = Transpose(", kh, ") {perm = [0, 1, 3, 2]}\n");
  t += StrCat("  %s = MatMul(", q, ", %kt)\n  %s1 = Mul(%s, %c)\n  %s2 = Add(%s1, %mask)\n");
  t += StrCat("  %p = Softmax(%s2) {axis = -1}\n  %o4 = MatMul(%p, ", vh, ")\n");
  t += "  %ot = Transpose(%o4) {perm = [0, 2, 1, 3]}\n  %out = Reshape(%ot, %os)\n";
  t += "  return %out, %present_k, %present_v\n}";
  return t;
}

// Tolerance of fused vs unfused (as fuse_attention_test.cc's, whose reasoning holds here: the
// attention is the same kernel; the present rows are copies and RopeRow, bit for bit).
constexpr double kTol = 1e-5;

// Plans the spec's graph unfused and fused, runs both on the same random inputs and compares
// every output; checks the fused plan launches `kernels` kernels, one FusedCachedAttention, and
// that the node agrees with its reference graph. Returns the fused graph.
std::unique_ptr<Graph> FusedMatchesUnfused(const CacheSpec& c, int64_t kernels) {
  const std::string text = DecoderText(c);
  auto unfused = ParseGraph(text);
  auto fused = ParseGraph(text);
  EXPECT_TRUE(unfused.ok() && fused.ok()) << unfused.status().ToString() << "\n" << text;
  if (!unfused.ok() || !fused.ok()) return nullptr;
  PipelineOptions off, on;
  off.fusion.enabled = false;
  EXPECT_TRUE(RunPipeline(**unfused, cpu::DefaultCpuTarget(), off).ok());
  const auto p = RunPipeline(**fused, cpu::DefaultCpuTarget(), on);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(CountOp(**fused, "FusedCachedAttention"), 1) << PrintGraph(**fused);
  EXPECT_EQ(CountOp(**fused, "Concat"), 0) << PrintGraph(**fused);
  EXPECT_EQ(CountKernels(**fused), kernels) << PrintGraph(**fused);
  ThreadPool pool(2);
  const CpuContext ctx{&pool};
  const std::vector<Tensor> ins = RandomInputs(**unfused, 13, 0.1, 1.5);
  auto yu = Execute(**unfused, Views(ins), ctx);
  auto yf = Execute(**fused, Views(ins), ctx);
  EXPECT_TRUE(yu.ok() && yf.ok());
  if (!yu.ok() || !yf.ok()) return nullptr;
  const char* names[3] = {"the output", "present K", "present V"};
  for (size_t o = 0; o < 3; ++o) {
    EXPECT_EQ((*yf)[o].shape(), (*yu)[o].shape()) << names[o];
    EXPECT_GT(MaxAbs((*yu)[o]), 0.05) << names[o];
    EXPECT_LT(MaxAbsDiff((*yf)[o], (*yu)[o]), kTol * (1 + MaxAbs((*yu)[o]))) << names[o];
  }
  // The node against its reference graph, on the inputs the plan gives it (when they are graph
  // inputs and constants).
  const Node* node = FindOp(**fused, "FusedCachedAttention");
  if (!node) return nullptr;
  for (const Value* v : node->inputs())
    if (v->producer()) return std::move(*fused);
  std::vector<TensorView> views;
  for (const Value* v : node->inputs()) {
    if (v->constant()) views.push_back(v->constant()->view());
    for (size_t i = 0; i < (*fused)->inputs().size(); ++i)
      if ((*fused)->inputs()[i] == v) views.push_back(ins[i].view());
  }
  EXPECT_EQ(views.size(), node->inputs().size());
  if (views.size() != node->inputs().size()) return nullptr;
  std::vector<Tensor> once;
  std::vector<TensorView> outs;
  for (const Value* o : node->outputs()) once.push_back(Tensor::Empty(DType::kF32, o->shape()).value());
  for (Tensor& t : once) outs.push_back(t.view());
  EXPECT_TRUE(RunNodeOnce(*node, views, outs, ctx).ok());
  auto ref = Execute(*node->GetGraph("reference"), views, ctx);
  EXPECT_TRUE(ref.ok()) << ref.status().ToString();
  if (ref.ok()) {
    for (size_t o = 0; o < 3; ++o) EXPECT_LT(MaxAbsDiff(once[o], (*ref)[o]), kTol) << names[o] << " against the reference";
  }
  return std::move(*fused);
}

TEST(FuseAttentionCache, DecodeOverAPastMatchesUnfused) {
  auto g = FusedMatchesUnfused({.s = 1}, 1);
  ASSERT_NE(g, nullptr);
  const Node* n = FindOp(*g, "FusedCachedAttention");
  EXPECT_EQ(n->GetInt("past_seq", -1), 5);
  EXPECT_EQ(n->GetInt("rope_new_k", -1), 1);
  EXPECT_EQ(n->GetString("new_k_layout", ""), "bshd");
  EXPECT_EQ(n->input(1)->name(), "k");  // the new rows read where they lie, before the head split
  EXPECT_EQ(n->output(1)->name(), "present_k");
  EXPECT_EQ(n->output(2)->name(), "present_v");
}

TEST(FuseAttentionCache, ChunkOverAPastMatchesUnfused) { FusedMatchesUnfused({.s = 3}, 1); }

TEST(FuseAttentionCache, GroupedQueryHeadsMatchUnfused) {
  FusedMatchesUnfused({.kv = 2, .s = 1}, 1);
  auto g = FusedMatchesUnfused({.kv = 2, .s = 3}, 1);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(FindOp(*g, "FusedCachedAttention")->GetInt("kv_heads", -1), 2);
}

TEST(FuseAttentionCache, WithoutRopeMatchesUnfused) {
  FusedMatchesUnfused({.s = 1, .rope = false}, 1);
  FusedMatchesUnfused({.kv = 2, .s = 3, .rope = false}, 1);
}

TEST(FuseAttentionCache, EmptyPastMatchesUnfused) { FusedMatchesUnfused({.past = 0, .s = 3}, 1); }

// K roped with other tables than Q's: the node reads the roped K rows as bhsd heads (the Rope
// and the head split before it stay kernels).
TEST(FuseAttentionCache, KeyRopeOfItsOwnStaysApart) {
  auto g = FusedMatchesUnfused({.kv = 2, .s = 3, .k_own_tables = true}, 3);
  ASSERT_NE(g, nullptr);
  const Node* n = FindOp(*g, "FusedCachedAttention");
  EXPECT_EQ(n->GetInt("rope_new_k", -1), 0);
  EXPECT_EQ(n->GetString("new_k_layout", ""), "bhsd");
  EXPECT_EQ(n->input(1)->producer()->op(), "Rope");
}

// An excluded Concat keeps the append apart: the attention reads the present rows as before.
TEST(FuseAttentionCache, ExcludedAppendChangesNothing) {
  auto g = ParseGraph(DecoderText({}));
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(FuseAttention(**g, FusionOptions{}, nullptr).ok());
  FusionOptions o;
  const Node* concat = FindOp(**g, "Concat");
  ASSERT_NE(concat, nullptr);
  o.exclude.insert(concat->name());
  FusionReport report;
  auto formed = FuseAttentionCache(**g, o, &report);
  ASSERT_TRUE(formed.ok());
  EXPECT_EQ(*formed, 0);
  EXPECT_EQ(CountOp(**g, "FusedAttention"), 1);
  EXPECT_NE(FindRefusal(report, "excluded"), nullptr);
  o.enabled = false;
  EXPECT_EQ(FuseAttentionCache(**g, o, nullptr).value(), 0);
}

// The kernel refuses operands that do not match its attributes with a Status naming them.
TEST(FuseAttentionCache, KernelRejectsWrongPastRowsWithAStatus) {
  auto g = ParseGraph(DecoderText({}));
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(RunPipeline(**g, cpu::DefaultCpuTarget(), {}).ok());
  const Node* n = FindOp(**g, "FusedCachedAttention");
  ASSERT_NE(n, nullptr);
  std::vector<Tensor> ins;
  std::vector<TensorView> views;
  for (const Value* v : n->inputs()) {
    Shape s = v->shape();
    if (v->name() == "past_v") s[2] += 1;  // one past row too many
    ins.push_back(Tensor::Empty(v->dtype(), s).value());
  }
  for (Tensor& t : ins) views.push_back(t.view());
  std::vector<Tensor> outs;
  std::vector<TensorView> ov;
  for (const Value* o : n->outputs()) outs.push_back(Tensor::Empty(DType::kF32, o->shape()).value());
  for (Tensor& t : outs) ov.push_back(t.view());
  const Status st = RunNodeOnce(*n, views, ov, CpuContext{});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("past V"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace graphfuse
