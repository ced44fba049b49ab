// Each pass as text in, text out, for the cases that build their IR in code (attention blocks
// made by a helper, options other than the defaults, several passes in a row): the IR before the
// pass is parsed, the ONE pass runs, and the printed IR after it is matched against CHECK lines
// (filecheck.h). The cases that are plain text live as files under tests/passes
// (pass_files_test.cc), where the numeric harness also runs each.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "cpu/executor.h"
#include "cpu/cpu_target.h"
#include "filecheck.h"
#include "ir/text.h"
#include "passes/fold_constants.h"
#include "passes/fusion_passes.h"

namespace graphfuse {
namespace {

using Pass = std::function<Status(Graph&)>;

// Parses `ir`, runs `pass` on it, verifies the result and prints it; "" after a failure.
std::string RunPassOnText(const Pass& pass, const std::string& ir) {
  auto g = ParseGraph(ir);
  if (!g.ok()) {
    ADD_FAILURE() << "the IR before the pass does not parse: " << g.status().ToString();
    return "";
  }
  if (Status s = pass(**g); !s.ok()) {
    ADD_FAILURE() << "the pass failed: " << s.ToString();
    return "";
  }
  if (Status v = (*g)->Verify(); !v.ok()) {
    ADD_FAILURE() << "the graph after the pass does not verify: " << v.ToString() << "\n" << PrintGraph(**g);
    return "";
  }
  return PrintGraph(**g);
}

// The passes, each alone, with default options.
Status RunCanonicalize(Graph& g) { return Canonicalize(g).status(); }
Status RunFuseAttention(Graph& g) { return FuseAttention(g, {}, nullptr).status(); }
Status RunFuseAttentionProjections(Graph& g) { return FuseAttentionProjections(g, {}, nullptr).status(); }
Status RunFoldNormIntoGemm(Graph& g) { return FoldNormIntoGemm(g, {}, nullptr).status(); }
Status RunFuseRowwise(Graph& g) { return FuseRowwise(g, {}, nullptr).status(); }

// Runs `pass` on `ir` and matches the printed result against `checks`.
void ExpectPassOutput(const Pass& pass, const std::string& ir, const std::string& checks) {
  const std::string out = RunPassOnText(pass, ir);
  if (out.empty()) return;  // the failure is reported
  const Status s = testing::FileCheck(out, checks);
  EXPECT_TRUE(s.ok()) << s.message();
}

// ---- FoldConstants ----




// ---- Canonicalize ----





TEST(PassTextCanonicalize, GeluErfAndSilu) {
  ExpectPassOutput(RunCanonicalize, R"(graph @act(%x: f32[4,16], %z: f32[4,16]) {
  %sqrt2: f32[] = const [1.4142135381698608]
  %one: f32[] = const [1.0]
  %half: f32[] = const [0.5]
  %d = Div(%x, %sqrt2)
  %e = Erf(%d)
  %a = Add(%e, %one)
  %m = Mul(%x, %a)
  %g = Mul(%m, %half)
  %s = Sigmoid(%z)
  %t = Mul(%z, %s)
  %y = Mul(%g, %t)
  return %y
})",
                   // Rewritten nodes are appended and the graph re-sorted: the Silu comes first.
                   R"(
CHECK: graph @act(%x: f32[4,16], %z: f32[4,16]) {
CHECK-NEXT: %t: f32[4,16] = Silu(%z) {canonicalized_from = "Sigmoid_5, Mul_6"}
CHECK-NEXT: %g: f32[4,16] = Gelu(%x) {canonicalized_from = "Div_0, Erf_1, Add_2, Mul_3, Mul_4"}
CHECK-NEXT: %y: f32[4,16] = Mul(%g, %t)
CHECK-NEXT: return %y
)");
}




// ---- CanonicalizeViews ----






// ---- FuseAttention ----

// Two heads of width 4 over 4 positions, as exporters write the head split and merge.
std::string AttentionText(const std::string& scores_to_probs, const std::string& extra_const = "",
                          const std::string& returns = "%out") {
  return R"(graph @attn(%q: f32[1,4,8], %k: f32[1,4,8], %v: f32[1,4,8]) {
  %shape: i64[4] = const [1, 4, 2, 4]
  %oshape: i64[3] = const [1, 4, 8]
  %c: f32[] = const [2.0]
)" + extra_const +
         R"(  %qr = Reshape(%q, %shape)
  %q4 = Transpose(%qr) {perm = [0, 2, 1, 3]}
  %kr = Reshape(%k, %shape)
  %k4 = Transpose(%kr) {perm = [0, 2, 1, 3]}
  %kt = Transpose(%k4) {perm = [0, 1, 3, 2]}
  %vr = Reshape(%v, %shape)
  %v4 = Transpose(%vr) {perm = [0, 2, 1, 3]}
  %s = MatMul(%q4, %kt)
)" + scores_to_probs +
         R"(  %o4 = MatMul(%p, %v4)
  %ot = Transpose(%o4) {perm = [0, 2, 1, 3]}
  %out = Reshape(%ot, %oshape)
  return )" + returns + R"(
})";
}

TEST(PassTextFuseAttention, ScaledHeadsBecomeOneNode) {
  // The node reads q, k, v before their head split; its reference graph is the ops it replaced.
  ExpectPassOutput(RunFuseAttention, AttentionText(R"(  %s1 = Div(%s, %c)
  %p = Softmax(%s1) {axis = -1}
)"),
                   R"(
CHECK: graph @attn(
CHECK-NEXT: %out: f32[1,4,8] = FusedAttention(%q, %k, %v) {batch = 1, has_mask = 0, head_dim = 4, heads = 2,
CHECK-SAME: kernel_name = "attention_h2_d4_f32_{{[0-9a-f]{8}}}"
CHECK-SAME: reference = graph @fused_attention_0(%q: f32[1,4,8], %k: f32[1,4,8], %v: f32[1,4,8]) {
CHECK: %s: f32[1,2,4,4] = MatMul(%q4, %kt)
CHECK-NEXT: %s1: f32[1,2,4,4] = Div(%s, %c)
CHECK-NEXT: %p: f32[1,2,4,4] = Softmax(%s1) {axis = -1}
CHECK-NEXT: %o4: f32[1,2,4,4] = MatMul(%p, %v4)
CHECK: return %out
CHECK-NEXT: }, rope_k = 0, rope_q = 0, scale = 0.5, seq_k = 4, seq_q = 4, v_head_dim = 4
CHECK-NEXT: return %out
CHECK-NEXT: }
)");
}

TEST(PassTextFuseAttention, CausalMaskIsAnInput) {
  ExpectPassOutput(RunFuseAttention,
                   AttentionText(R"(  %s1 = Mul(%s, %c)
  %s2 = Add(%s1, %mask)
  %p = Softmax(%s2) {axis = -1}
)",
                                 "  %mask: f32[1,1,4,4] = const [0, -1e9, -1e9, -1e9, 0, 0, -1e9, -1e9, 0, 0, 0, "
                                 "-1e9, 0, 0, 0, 0]\n"),
                   R"(
CHECK: %mask: f32[1,1,4,4] = const
CHECK-NEXT: %out: f32[1,4,8] = FusedAttention(%q, %k, %v, %mask) {
CHECK-SAME: has_mask = 1
CHECK-SAME: kernel_name = "attention_mask_h2_d4_f32_{{[0-9a-f]{8}}}"
CHECK-SAME: mask_scale = 1.0
CHECK: %s1: f32[1,2,4,4] = Mul(%s, %c)
CHECK-NEXT: %s2: f32[1,2,4,4] = Add(%s1, %mask)
CHECK: }, rope_k = 0, rope_q = 0, scale = 2.0, seq_k = 4, seq_q = 4,
CHECK-NEXT: return %out
)");
}

TEST(PassTextFuseAttention, RepeatedKvHeadsAreReadAsTheFewerHeads) {
  // transformers' repeat_kv (Unsqueeze, Expand, Reshape) of a [1,2,4,4] cache to 4 heads, on K
  // and V alike: the node reads the caches themselves, kv_heads = 2, and takes the repeats in.
  // Only V repeated: nothing to share, the repeat stays and the node reads its result.
  const std::string body = R"(  %qs: i64[4] = const [1, 4, 4, 4]
  %ax: i64[1] = const [2]
  %ex: i64[5] = const [1, 2, 2, 4, 4]
  %rs: i64[4] = const [1, 4, 4, 4]
  %qr = Reshape(%q, %qs)
  %q4 = Transpose(%qr) {perm = [0, 2, 1, 3]}
  %vu = Unsqueeze(%v, %ax)
  %vx = Expand(%vu, %ex)
  %vh = Reshape(%vx, %rs)
)";
  const std::string tail = R"(  %s = MatMul(%q4, %kt)
  %p = Softmax(%s) {axis = -1}
  %o = MatMul(%p, %vh)
  return %o
})";
  ExpectPassOutput(RunFuseAttention, R"(graph @gqa(%q: f32[1,4,16], %k: f32[1,2,4,4], %v: f32[1,2,4,4]) {
)" + body + R"(  %ku = Unsqueeze(%k, %ax)
  %kx = Expand(%ku, %ex)
  %kh = Reshape(%kx, %rs)
  %kt = Transpose(%kh) {perm = [0, 1, 3, 2]}
)" + tail,
                   R"(
CHECK-NOT: Expand(
CHECK: %o: f32[1,4,4,4] = FusedAttention(%q, %k, %v) {
CHECK-SAME: heads = 4,
CHECK-SAME: k_layout = "bhsd",
CHECK-SAME: kernel_name = "attention_h4_kv2_d4_f32_{{[0-9a-f]{8}}}",
CHECK-SAME: kv_heads = 2,
CHECK: v_layout = "bhsd"}
CHECK-NEXT: return %o
)");
  ExpectPassOutput(RunFuseAttention, R"(graph @vonly(%q: f32[1,4,16], %k: f32[1,4,4,4], %v: f32[1,2,4,4]) {
)" + body + R"(  %kt = Transpose(%k) {perm = [0, 1, 3, 2]}
)" + tail,
                   R"(
CHECK: %vh: f32[1,4,4,4] = Reshape(%vx, %rs)
CHECK: %o: f32[1,4,4,4] = FusedAttention(%q, %k, %vh) {
CHECK-NOT: kv_heads
CHECK: return %o
)");
}

TEST(PassTextFuseAttention, ScoresReadOutsideAreNotFused) {
  // The scaled scores are also returned: the pattern's intermediates must stay private.
  ExpectPassOutput(RunFuseAttention, AttentionText(R"(  %s1 = Div(%s, %c)
  %p = Softmax(%s1) {axis = -1}
)",
                                                   "", "%out, %s1"),
                   R"(
CHECK-NOT: FusedAttention
CHECK: %s: f32[1,2,4,4] = MatMul(%q4, %kt)
CHECK-NEXT: %s1: f32[1,2,4,4] = Div(%s, %c)
CHECK-NEXT: %p: f32[1,2,4,4] = Softmax(%s1) {axis = -1}
CHECK-NEXT: %o4: f32[1,2,4,4] = MatMul(%p, %v4)
CHECK: return %out, %s1
CHECK-NOT: FusedAttention
)");
}

TEST(PassTextFuseAttention, SoftmaxOverAnotherAxisIsNotAttention) {
  ExpectPassOutput(RunFuseAttention, AttentionText(R"(  %s1 = Div(%s, %c)
  %p = Softmax(%s1) {axis = 2}
)"),
                   R"(
CHECK-NOT: FusedAttention
CHECK: %s: f32[1,2,4,4] = MatMul(%q4, %kt)
CHECK-NEXT: %s1: f32[1,2,4,4] = Div(%s, %c)
CHECK-NEXT: %p: f32[1,2,4,4] = Softmax(%s1) {axis = 2}
CHECK-NEXT: %o4: f32[1,2,4,4] = MatMul(%p, %v4)
CHECK-NOT: FusedAttention
)");
}



// ---- FuseElementwise ----






// ---- FuseGemm ----

// Projections of one input with the same width: one GEMM over the weights side by side.




// ---- FuseAttentionProjections ----

// A QKV FusedGemm whose three outputs only the attention reads (one head of width 2 over 2
// positions), as FuseGemm and FuseAttention leave it.
std::string QkvAttentionText(const std::string& returns) {
  return R"(graph @qkv_attn(%x: f32[1,2,2]) {
  %w: f32[2,6] = const [1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1]
  %mask: f32[2,2] = const [0, -1e9, 0, 0]
  %q, %k, %v = FusedGemm(%x, %w) {out_proj = [0, 1, 2], splits = 3}
  %o = FusedAttention(%q, %k, %v, %mask) {batch = 1, has_mask = 1, head_dim = 2, heads = 1,
      kernel_name = "attention_mask_h1_d2_f32_0badcafe", output_shape = [1, 2, 2], rope_k = 0, rope_q = 0,
      scale = 0.5, seq_k = 2, seq_q = 2, v_head_dim = 2}
  return )" + returns + R"(
})";
}

TEST(PassTextFuseAttentionProjections, QkvGemmMovesIntoTheAttention) {
  ExpectPassOutput(RunFuseAttentionProjections, QkvAttentionText("%o"),
                   R"(
CHECK: %mask: f32[2,2] = const [0.0, -1e+09, 0.0, 0.0]
CHECK-NEXT: %o: f32[1,2,2] = FusedAttention(%x, %w, %mask) {
CHECK-SAME: kernel_name = "qkv_attention_mask_h1_d2_f32_0badcafe"
CHECK-SAME: qkv_proj = 1, qkv_split = [0, 1, 2], reference = graph
CHECK-NEXT: %q: f32[1,2,2], %k: f32[1,2,2], %v: f32[1,2,2] = FusedGemm(
CHECK-NEXT: %o: f32[1,2,2] = FusedAttention(%q, %k, %v,
CHECK-NEXT: return %o
CHECK-NEXT: }, rope_k = 0, rope_q = 0, scale = 0.5,
CHECK-NEXT: return %o
)");
}

TEST(PassTextFuseAttentionProjections, GroupedQueryProjectionsMoveIntoTheAttention) {
  // Grouped-query attention: 2 query heads, 1 K / V head of 2. q's projection is 4 wide, k's and
  // v's 2 each, so FuseGemm joins k and v alone (and q stays a MatMul, or a FusedGemm with its
  // bias); both move into the attention: W is q's columns, then k's and v's, one [4, 8]
  // constant (the biases likewise, one [8]); the reference slices each GEMM's columns back out.
  const Pass gemm_then_projection = [](Graph& g) {
    GF_RETURN_IF_ERROR(FuseGemm(g, {}, nullptr).status());
    return FuseAttentionProjections(g, {}, nullptr).status();
  };
  auto text = [](bool biased) {
    return StrCat(R"(graph @gqa_proj(%x: f32[1,3,4]) {
  %wq: f32[4,4] = const [1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 0, 0, 0, 0, 1, 1]
  %wk: f32[4,2] = const [1, 0, 0, 1, 1, 1, 0, 0]
  %wv: f32[4,2] = const [0, 1, 1, 0, 0, 0, 1, 1]
  %bq: f32[4] = const [0.1, 0.2, 0.3, 0.4]
  %bk: f32[2] = const [0.5, 0.6]
  %bv: f32[2] = const [0.7, 0.8]
  %pq = MatMul(%x, %wq)
  %pk = MatMul(%x, %wk)
  %pv = MatMul(%x, %wv)
)",
                  biased ? R"(  %q = Add(%pq, %bq)
  %k = Add(%pk, %bk)
  %v = Add(%bv, %pv)
)"
                         : R"(  %q = Identity(%pq)
  %k = Identity(%pk)
  %v = Identity(%pv)
)",
                  R"(  %o = FusedAttention(%q, %k, %v) {batch = 1, has_mask = 0, head_dim = 2, heads = 2, kv_heads = 1,
      kernel_name = "attention_h2_kv1_d2_f32_0badcafe", output_shape = [1, 3, 4], rope_k = 0, rope_q = 0,
      scale = 0.5, seq_k = 3, seq_q = 3, v_head_dim = 2}
  return %o
})");
  };
  // Without biases (the Identity nodes go first, as Canonicalize removes them).
  const Pass canonical_then_projection = [&](Graph& g) {
    GF_RETURN_IF_ERROR(Canonicalize(g).status());
    return gemm_then_projection(g);
  };
  ExpectPassOutput(canonical_then_projection, text(false),
                   R"(
CHECK: %MatMul_0_qkv_weights{{[_0-9]*}}: f32[4,8] = const [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0,
CHECK-NOT: FusedGemm(%x
CHECK-NOT: MatMul(%x
CHECK: %o: f32[1,3,4] = FusedAttention(%x, %MatMul_0_qkv_weights{{[_0-9]*}}) {
CHECK-SAME: kernel_name = "qkv_attention_h2_kv1_d2_f32_0badcafe"
CHECK-SAME: kv_heads = 1,
CHECK-SAME: qkv_proj = 1, qkv_split = [0, 1, 2], reference = graph
CHECK: %MatMul_0/weights{{[_0-9]*}}: f32[4,4] = Slice(
CHECK: %pq: f32[1,3,4] = MatMul(
CHECK: %fused_gemm{{[_0-9]*}}/weights{{[_0-9]*}}: f32[4,4] = Slice(
CHECK: %pk: f32[1,3,2], %pv: f32[1,3,2] = FusedGemm(
CHECK: %o: f32[1,3,4] = FusedAttention(%pq, %pk, %pv)
CHECK-NEXT: return %o
)");
  ExpectPassOutput(gemm_then_projection, text(true),
                   R"(
CHECK: %fused_gemm{{[_0-9]*}}_qkv_bias{{[_0-9]*}}: f32[8] = const [0.100000001, 0.200000003, 0.300000012, 0.400000006, 0.5, 0.600000024, 0.699999988, 0.800000012]
CHECK-NOT: FusedGemm(%x
CHECK: %o: f32[1,3,4] = FusedAttention(%x, %fused_gemm{{[_0-9]*}}_qkv_weights{{[_0-9]*}}, %fused_gemm{{[_0-9]*}}_qkv_bias{{[_0-9]*}}) {
CHECK-SAME: kv_heads = 1,
CHECK-SAME: qkv_bias = 1, qkv_proj = 1, qkv_split = [0, 1, 2], reference = graph
CHECK: %bq/slice{{[_0-9]*}}: f32[4] = Slice(
CHECK: %q: f32[1,3,4] = FusedGemm(
CHECK: %bk/slice{{[_0-9]*}}: f32[2] = Slice(
CHECK: %bv/slice{{[_0-9]*}}: f32[2] = Slice(
CHECK: %k: f32[1,3,2], %v: f32[1,3,2] = FusedGemm(
CHECK: %o: f32[1,3,4] = FusedAttention(%q, %k, %v)
CHECK-NEXT: return %o
)");
}

TEST(PassTextFuseAttentionProjections, QkvGemmWithBiasesMovesIntoTheAttention) {
  // The GEMM's epilogue only adds a bias to each projection (FuseGemm makes it from the three
  // biased projections; the text IR has no graph attributes): the node reads the three biases
  // as one constant in W's column order, and its reference slices them back out for the GEMM.
  const Pass gemm_then_projection = [](Graph& g) {
    GF_RETURN_IF_ERROR(FuseGemm(g, {}, nullptr).status());
    return FuseAttentionProjections(g, {}, nullptr).status();
  };
  ExpectPassOutput(gemm_then_projection, R"(graph @qkv_attn(%x: f32[1,2,2]) {
  %wq: f32[2,2] = const [1, 0, 1, 0]
  %wk: f32[2,2] = const [0, 1, 0, 1]
  %wv: f32[2,2] = const [1, 0, 1, 1]
  %bq: f32[2] = const [0.1, 0.2]
  %bk: f32[2] = const [0.3, 0.4]
  %bv: f32[2] = const [0.5, 0.6]
  %pq = MatMul(%x, %wq)
  %pk = MatMul(%x, %wk)
  %pv = MatMul(%x, %wv)
  %q = Add(%pq, %bq)
  %k = Add(%bk, %pk)
  %v = Add(%pv, %bv)
  %o = FusedAttention(%q, %k, %v) {batch = 1, has_mask = 0, head_dim = 2, heads = 1,
      kernel_name = "attention_h1_d2_f32_0badcafe", output_shape = [1, 2, 2], rope_k = 0, rope_q = 0,
      scale = 0.5, seq_k = 2, seq_q = 2, v_head_dim = 2}
  return %o
})",
                   R"(
CHECK: {{%[^:]*}}_qkv_bias{{[_0-9]*}}: f32[6] = const [0.100000001, 0.200000003, 0.300000012, 0.400000006, 0.5, 0.600000024]
CHECK-NEXT: %o: f32[1,2,2] = FusedAttention(%x, %MatMul_0_weights_x3{{[_0-9]*}}, {{%[^)]*}}_qkv_bias{{[_0-9]*}}) {
CHECK-SAME: qkv_bias = 1, qkv_proj = 1, qkv_split = [0, 1, 2], reference = graph
CHECK: = Slice(
CHECK: = Slice(
CHECK: = Slice(
CHECK: %q: f32[1,2,2], %k: f32[1,2,2], %v: f32[1,2,2] = FusedGemm(%x_0, %MatMul_0_weights_x3{{[_0-9]*}}, %bq/slice{{[_0-9]*}}, %bk/slice{{[_0-9]*}}, %bv/slice{{[_0-9]*}}) {epilogue
CHECK: %o: f32[1,2,2] = FusedAttention(%q, %k, %v)
CHECK-NEXT: return %o
CHECK-NEXT: }, rope_k = 0
CHECK-NEXT: return %o
)");
}

TEST(PassTextFuseAttentionProjections, QReadElsewhereKeepsTheTwoNodes) {
  ExpectPassOutput(RunFuseAttentionProjections, QkvAttentionText("%o, %q"),
                   R"(
CHECK: %q: f32[1,2,2], %k: f32[1,2,2], %v: f32[1,2,2] = FusedGemm(%x, %w)
CHECK-NEXT: %o: f32[1,2,2] = FusedAttention(%q, %k, %v, %mask)
CHECK-NOT: qkv_proj
CHECK: return %o, %q
)");
}

// Without a mask or RoPE the projected node reads x and W only, and computes what the two
// nodes did.
TEST(PassTextFuseAttentionProjections, NoMaskNoRope) {
  const std::string text = R"(graph @qkv_attn(%x: f32[1,3,2]) {
  %w: f32[2,6] = const [1, 0, 0.5, 1, 1, 0, 0, 1, 0, 1, -1, 1]
  %q, %k, %v = FusedGemm(%x, %w) {out_proj = [0, 1, 2], splits = 3}
  %o = FusedAttention(%q, %k, %v) {batch = 1, has_mask = 0, head_dim = 2, heads = 1,
      kernel_name = "attention_h1_d2_f32_0badcafe", output_shape = [1, 3, 2], rope_k = 0, rope_q = 0,
      scale = 0.5, seq_k = 3, seq_q = 3, v_head_dim = 2}
  return %o
})";
  ExpectPassOutput(RunFuseAttentionProjections, text, R"(
CHECK: %o: f32[1,3,2] = FusedAttention(%x, %w) {
CHECK-SAME: qkv_proj = 1
CHECK-NOT: FusedGemm(%x, %w)
)");
  auto apart = ParseGraph(text);
  auto projected = ParseGraph(text);
  ASSERT_TRUE(apart.ok() && projected.ok());
  ASSERT_TRUE(RunFuseAttentionProjections(**projected).ok());
  Tensor x = Tensor::Empty(DType::kF32, {1, 3, 2}).value();
  const float xs[] = {0.3f, -1.2f, 0.7f, 0.1f, -0.4f, 0.9f};
  for (int i = 0; i < 6; ++i) x.SetFromDouble(i, xs[i]);
  const TensorView in[] = {x.view()};
  auto want = Execute(**apart, in, CpuContext{});
  auto got = Execute(**projected, in, CpuContext{});
  ASSERT_TRUE(want.ok() && got.ok()) << (got.ok() ? want.status() : got.status()).ToString();
  for (int64_t i = 0; i < 6; ++i) EXPECT_NEAR(got->at(0).GetAsDouble(i), want->at(0).GetAsDouble(i), 1e-6) << i;
}

// ---- FoldNormIntoGemm ----

// h = a W1 (a FusedGemm), y = RMSNorm(h, gamma), z = y W2 (a FusedGemm); h goes on.
std::string NormBetweenGemmsText(const std::string& gamma) {
  return R"(graph @fold(%a: f32[2,4]) {
  %w1: f32[4,4] = const [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]
  %w2: f32[4,2] = const [1, 1, 1, 1, 1, 1, 1, 1]
)" + gamma + R"(  %h = FusedGemm(%a, %w1) {out_proj = [0], splits = 1}
  %y = RMSNorm(%h, %gamma) {epsilon = 0.5}
  %z = FusedGemm(%y, %w2) {out_proj = [0], splits = 1}
  return %z, %h
})";
}

TEST(PassTextFoldNormIntoGemm, NormRunsInsideTheTwoGemms) {
  ExpectPassOutput(RunFoldNormIntoGemm, NormBetweenGemmsText("  %gamma: f32[4] = const [1, 2, 3, 4]\n"),
                   R"(
CHECK-NOT: RMSNorm(
CHECK: %w2_times_{{[^:]*}}: f32[4,2] = const [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]
CHECK-NEXT: %h: f32[2,4], %h_inv_rms{{[_0-9]*}}: f32[2,1] = FusedGemm(%a, %w1) {kernel_name = "gemm_rms", out_proj = [0], reference = graph
CHECK-NEXT: %epsilon{{[_0-9]*}}: f32[1] = const [0.5]
CHECK-NEXT: %h: f32[2,4] = FusedGemm(
CHECK-NEXT: = Mul(%h, %h)
CHECK-NEXT: = ReduceMean(
CHECK: }, rms_epsilon = 0.5, splits = 1}
CHECK-NEXT: %z: f32[2,2] = FusedGemm(%h, %w2_times_{{[^,]*}}, %h_inv_rms{{[_0-9]*}}) {kernel_name = "gemm_rmsnorm", out_proj = [0], reference = graph
CHECK-NEXT: = Mul(
CHECK-NEXT: %z: f32[2,2] = FusedGemm(
CHECK: }, row_scale = 2, splits = 1}
CHECK-NEXT: return %z, %h
)");
}

TEST(PassTextFoldNormIntoGemm, ScaleThatIsNotAConstantStays) {
  ExpectPassOutput(RunFoldNormIntoGemm,
                   R"(graph @fold(%a: f32[2,4], %gamma: f32[4]) {
  %w1: f32[4,4] = const [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]
  %w2: f32[4,2] = const [1, 1, 1, 1, 1, 1, 1, 1]
  %h = FusedGemm(%a, %w1) {out_proj = [0], splits = 1}
  %y = RMSNorm(%h, %gamma) {epsilon = 0.5}
  %z = FusedGemm(%y, %w2) {out_proj = [0], splits = 1}
  return %z, %h
})",
                   R"(
CHECK-NOT: rms_epsilon
CHECK: %h: f32[2,4] = FusedGemm(%a, %w1) {out_proj = [0], splits = 1}
CHECK-NEXT: %y: f32[2,4] = RMSNorm(%h, %gamma) {epsilon = 0.5}
CHECK-NEXT: %z: f32[2,2] = FusedGemm(%y, %w2) {out_proj = [0], splits = 1}
CHECK-NOT: row_scale
)");
}

// Off, as RunPipeline sets it for a target without the form (CUDA).
TEST(PassTextFoldNormIntoGemm, OffWhenTheFormIsOff) {
  const Pass form_off = [](Graph& g) {
    FusionOptions o;
    o.norm_into_gemm = false;
    return FoldNormIntoGemm(g, o, nullptr).status();
  };
  ExpectPassOutput(form_off, NormBetweenGemmsText("  %gamma: f32[4] = const [1, 2, 3, 4]\n"),
                   R"(
CHECK-NOT: rms_epsilon
CHECK: %h: f32[2,4] = FusedGemm(%a, %w1) {out_proj = [0], splits = 1}
CHECK-NEXT: %y: f32[2,4] = RMSNorm(%h, %gamma) {epsilon = 0.5}
CHECK-NEXT: %z: f32[2,2] = FusedGemm(%y, %w2) {out_proj = [0], splits = 1}
CHECK-NOT: row_scale
)");
}

// ---- FuseRowwise ----




Status RunFuseRowwiseF32Only(Graph& g) {
  FusionOptions o;
  o.narrow_row_kernels = false;  // a target without f16 / bf16 row kernels (the CPU)
  return FuseRowwise(g, o, nullptr).status();
}

constexpr char kOtherAxisAndF16[] = R"(graph @s(%x: f32[8,16], %b: f32[16], %y: f16[4,8], %r: f16[4,8], %w: f16[8]) {
  %0 = Add(%x, %b)
  %a = Softmax(%0) {axis = 0}
  %h = Add(%y, %r)
  %n = RMSNorm(%h, %w)
  return %a, %n
})";

TEST(PassTextFuseRowwise, RowOpsOverAnotherAxisOrDtypeStay) {
  ExpectPassOutput(RunFuseRowwiseF32Only, kOtherAxisAndF16, R"(
CHECK-NOT: Fused
CHECK: %0: f32[8,16] = Add(%x, %b)
CHECK-NEXT: %a: f32[8,16] = Softmax(%0) {axis = 0}
CHECK-NEXT: %h: f16[4,8] = Add(%y, %r)
CHECK-NEXT: %n: f16[4,8] = RMSNorm(%h, %w)
CHECK-NOT: Fused
)");
}

// Where the target has narrow row kernels, the f16 norm takes its prologue; the other axis stays.
TEST(PassTextFuseRowwise, NarrowRowsFuseWhereTheTargetTakesThem) {
  ExpectPassOutput(RunFuseRowwise, kOtherAxisAndF16, R"(
CHECK: %a: f32[8,16] = Softmax(%0) {axis = 0}
CHECK-NEXT: %n: f16[4,8] = FusedNorm(%y, %r, %w) {body = graph @fused_norm_0(%y: f16[4,8], %r: f16[4,8]) {
CHECK-NEXT: %h: f16[4,8] = Add(%y, %r)
)");
}

// ---- FuseAttentionCache ----

Status RunFuseAttentionThenCache(Graph& g) {
  GF_RETURN_IF_ERROR(FuseAttention(g, {}, nullptr).status());
  return FuseAttentionCache(g, {}, nullptr).status();
}

// One decode step of a grouped-query decoder (4 query heads, 2 K / V heads, 3 past rows): the
// new K rows head-split and roped, K and V appended to the past by Concat and returned, then
// repeated for the query heads. FuseAttention forms the attention over the present rows;
// FuseAttentionCache takes the appends, the new rows' head splits and K's RoPE in.
constexpr char kDecodeStep[] = R"(graph @decode(%q: f32[1,1,16], %k: f32[1,1,8], %v: f32[1,1,8], %past_k: f32[1,2,3,4], %past_v: f32[1,2,3,4], %cos: f32[1,1,1,4], %sin: f32[1,1,1,4], %mask: f32[1,1,1,4]) {
  %qs: i64[4] = const [1, 1, 4, 4]
  %ks: i64[4] = const [1, 1, 2, 4]
  %ax: i64[1] = const [2]
  %ex: i64[5] = const [1, 2, 2, 4, 4]
  %rs: i64[4] = const [1, 4, 4, 4]
  %os: i64[3] = const [1, 1, 16]
  %c: f32[] = const [0.5]
  %qr = Reshape(%q, %qs)
  %q4 = Transpose(%qr) {perm = [0, 2, 1, 3]}
  %kr = Reshape(%k, %ks)
  %k4 = Transpose(%kr) {perm = [0, 2, 1, 3]}
  %vr = Reshape(%v, %ks)
  %v4 = Transpose(%vr) {perm = [0, 2, 1, 3]}
  %qe = Rope(%q4, %cos, %sin)
  %ke = Rope(%k4, %cos, %sin)
  %present_k = Concat(%past_k, %ke) {axis = -2}
  %present_v = Concat(%past_v, %v4) {axis = -2}
  %ku = Unsqueeze(%present_k, %ax)
  %kx = Expand(%ku, %ex)
  %kh = Reshape(%kx, %rs)
  %vu = Unsqueeze(%present_v, %ax)
  %vx = Expand(%vu, %ex)
  %vh = Reshape(%vx, %rs)
  %kt = Transpose(%kh) {perm = [0, 1, 3, 2]}
  %s = MatMul(%qe, %kt)
  %s1 = Mul(%s, %c)
  %s2 = Add(%s1, %mask)
  %p = Softmax(%s2) {axis = -1}
  %o4 = MatMul(%p, %vh)
  %ot = Transpose(%o4) {perm = [0, 2, 1, 3]}
  %out = Reshape(%ot, %os)
  return %out, %present_k, %present_v
})";

TEST(PassTextFuseAttentionCache, DecodeStepAppendsInsideTheAttention) {
  ExpectPassOutput(RunFuseAttentionThenCache, kDecodeStep, R"(
CHECK: graph @decode(
CHECK-NOT: Concat(
CHECK-NOT: Rope(
CHECK: %out: f32[1,1,16], %present_k: f32[1,2,4,4], %present_v: f32[1,2,4,4] = FusedCachedAttention(%q, %k, %v, %past_k, %past_v, %mask, %cos, %sin) {
CHECK-SAME: k_layout = "bhsd",
CHECK-SAME: kernel_name = "kvcache_attention_rope_mask_h4_kv2_d4_f32_{{[0-9a-f]{8}}}",
CHECK-SAME: kv_heads = 2,
CHECK-SAME: new_k_layout = "bshd", new_v_layout = "bshd",
CHECK-SAME: past_seq = 3,
CHECK-SAME: reference = graph @fused_attention_0(%q: f32[1,1,16], %k: f32[1,1,8], %v: f32[1,1,8], %past_k: f32[1,2,3,4], %past_v: f32[1,2,3,4], %mask: f32[1,1,1,4], %cos: f32[1,1,1,4], %sin: f32[1,1,1,4]) {
CHECK: %ke: f32[1,2,1,4] = Rope(%k4, %cos, %sin)
CHECK: %present_k: f32[1,2,4,4] = Concat(%past_k, %ke) {axis = -2}
CHECK-NEXT: %present_v: f32[1,2,4,4] = Concat(%past_v, %v4) {axis = -2}
CHECK-NEXT: %out: f32[1,1,16] = FusedAttention(%q, %present_k, %present_v, %mask, %cos, %sin) {
CHECK: return %out, %present_k, %present_v
CHECK-NEXT: }, rope_k = 0, rope_new_k = 1, rope_q = 1, scale = 0.5, seq_k = 4, seq_q = 1,
CHECK-NEXT: return %out, %present_k, %present_v
CHECK-NEXT: }
)");
}

// The present K rows also feed something else (here a graph output of their sum): they are the
// node's output all the same. V's new rows are read by another node too: their head split stays
// and the node reads its result as bhsd rows.
TEST(PassTextFuseAttentionCache, SharedNewRowsAreReadWhereTheyLie) {
  std::string text = kDecodeStep;
  text.replace(text.find("  return %out, %present_k, %present_v"), std::string::npos, R"(  %tap = Neg(%v4)
  %sum = ReduceSum(%present_k)
  return %out, %present_k, %present_v, %tap, %sum
})");
  ExpectPassOutput(RunFuseAttentionThenCache, text, R"(
CHECK: %v4: f32[1,2,1,4] = Transpose(%vr) {perm = [0, 2, 1, 3]}
CHECK: %out: f32[1,1,16], %present_k: f32[1,2,4,4], %present_v: f32[1,2,4,4] = FusedCachedAttention(%q, %k, %v4, %past_k, %past_v, %mask, %cos, %sin) {
CHECK-SAME: new_k_layout = "bshd", new_v_layout = "bhsd",
CHECK: %sum: f32[1,1,1,1] = ReduceSum(%present_k)
CHECK-NEXT: return %out, %present_k, %present_v, %tap, %sum
)");
}

}  // namespace
}  // namespace graphfuse
