// Each pass as text in, text out: the IR before the pass is parsed, the ONE pass runs, and the
// printed IR after it is matched against CHECK lines (filecheck.h). The numeric tests of each
// pass (its own *_test.cc) run the same rewrites against the unfused graph; these pin the
// rewrite itself: which nodes become what, their inputs, outputs and attributes.
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
Status RunFoldConstants(Graph& g) { return FoldConstants(g, FoldOptions{&cpu::DefaultCpuTarget()}).status(); }
Status RunCanonicalize(Graph& g) { return Canonicalize(g).status(); }
Status RunCanonicalizeViews(Graph& g) { return CanonicalizeViews(g).status(); }
Status RunFuseAttention(Graph& g) { return FuseAttention(g, {}, nullptr).status(); }
Status RunFuseElementwise(Graph& g) { return FuseElementwise(g).status(); }
Status RunFuseGemm(Graph& g) { return FuseGemm(g, {}, nullptr).status(); }
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

TEST(PassTextFoldConstants, ConstantSubgraphBecomesAConstant) {
  ExpectPassOutput(RunFoldConstants, R"(graph @fold(%x: f32[3]) {
  %a: f32[3] = const [1.0, 2.0, 3.0]
  %b: f32[3] = const [0.5, 0.5, 0.5]
  %0 = Mul(%a, %b)
  %1 = Exp(%0)
  %2 = Add(%x, %1)
  return %2
})",
                   R"(
CHECK: graph @fold(%x: f32[3]) {
CHECK-NEXT: %1: f32[3] = const [1.64872{{[0-9]*}}, 2.71828{{[0-9]*}}, 4.48168{{[0-9]*}}]
CHECK-NEXT: %2: f32[3] = Add(%x, %1)
CHECK-NEXT: return %2
)");
}

TEST(PassTextFoldConstants, ShapeOfAStaticValueFolds) {
  // Shape reads no data: with x's shape known, the Shape and what computes from it fold.
  ExpectPassOutput(RunFoldConstants, R"(graph @shape(%x: f32[2,3,4], %v: f32[3]) {
  %s = Shape(%x)
  %f = Cast(%s) {to = 0}
  %o = Add(%v, %f)
  return %o
})",
                   R"(
CHECK: graph @shape(%x: f32[2,3,4], %v: f32[3]) {
CHECK-NEXT: %f: f32[3] = const [2.0, 3.0, 4.0]
CHECK-NEXT: %o: f32[3] = Add(%v, %f)
CHECK-NEXT: return %o
)");
}

TEST(PassTextFoldConstants, NodeReadingAnInputStays) {
  ExpectPassOutput(RunFoldConstants, R"(graph @keep(%x: f32[3]) {
  %a: f32[3] = const [1.0, 2.0, 3.0]
  %0 = Mul(%x, %a)
  return %0
})",
                   R"(
CHECK: %a: f32[3] = const [1.0, 2.0, 3.0]
CHECK-NEXT: %0: f32[3] = Mul(%x, %a)
CHECK-NEXT: return %0
)");
}

// ---- Canonicalize ----

TEST(PassTextCanonicalize, RmsNormAsExported) {
  ExpectPassOutput(RunCanonicalize, R"(graph @rms(%x: f32[2,64], %w: f32[64]) {
  %two: f32[] = const [2.0]
  %eps: f32[] = const [1e-6]
  %one: f32[] = const [1.0]
  %sq = Pow(%x, %two)
  %mean = ReduceMean(%sq) {axes = [-1], keepdims = 1}
  %s = Add(%mean, %eps)
  %rms = Sqrt(%s)
  %inv = Div(%one, %rms)
  %xn = Mul(%x, %inv)
  %y = Mul(%xn, %w)
  return %y
})",
                   R"(
CHECK: graph @rms(%x: f32[2,64], %w: f32[64]) {
CHECK-NEXT: %y: f32[2,64] = RMSNorm(%x, %w) {axis = -1,
CHECK-SAME: canonicalized_from = "Pow_0, ReduceMean_1, Add_2, Sqrt_3, Div_4, Mul_5, Mul_6"
CHECK-SAME: epsilon = 9.99999997e-07
CHECK-NEXT: return %y
)");
}

TEST(PassTextCanonicalize, IdentityCastsGoAndTheRmsNormIsWhole) {
  // transformers' LlamaRMSNorm as the TorchScript exporter writes it in f32: Cast(to f32) around
  // the normalization, then the weight. The casts go, and the norm with its weight is one op.
  ExpectPassOutput(RunCanonicalize, R"(graph @rms(%x: f32[2,64], %w: f32[64]) {
  %two: f32[] = const [2.0]
  %eps: f32[] = const [1e-6]
  %one: f32[] = const [1.0]
  %c = Cast(%x) {to = 0}
  %sq = Pow(%c, %two)
  %mean = ReduceMean(%sq) {axes = [-1], keepdims = 1}
  %s = Add(%mean, %eps)
  %rms = Sqrt(%s)
  %inv = Div(%one, %rms)
  %xn = Mul(%c, %inv)
  %c1 = Cast(%xn) {to = 0}
  %y = Mul(%w, %c1)
  return %y
})",
                   R"(
CHECK: graph @rms(%x: f32[2,64], %w: f32[64]) {
CHECK-NEXT: %y: f32[2,64] = RMSNorm(%x, %w) {axis = -1,
CHECK-NOT: Cast(
CHECK: return %y
)");
}

TEST(PassTextCanonicalize, IdentityNodesGoUnlessReturned) {
  // A Cast to the dtype it has and a one-input Concat return their input; a Cast that converts,
  // and an identity whose result is a graph output, stay.
  ExpectPassOutput(RunCanonicalize, R"(graph @id(%x: f32[2,4], %i: i64[2,4]) {
  %a = Cast(%x) {to = 0}
  %b = Concat(%a) {axis = -2}
  %c = Exp(%b)
  %d = Cast(%i) {to = 4}
  %e = Cast(%d) {to = 0}
  %f = Cast(%c) {to = 0}
  return %e, %f
})",
                   R"(
CHECK: graph @id(%x: f32[2,4], %i: i64[2,4]) {
CHECK-NEXT: %c: f32[2,4] = Exp(%x)
CHECK-NEXT: %e: f32[2,4] = Cast(%i) {to = 0}
CHECK-NEXT: %f: f32[2,4] = Cast(%c) {to = 0}
CHECK-NEXT: return %e, %f
)");
}

TEST(PassTextCanonicalize, InOrderGatherIsAViewAndNoOpsGo) {
  // transformers' padding mask: the rows of a flattened [B*S, 1] mask gathered in order, an
  // Expand to the shape it has; RoPE's cos times attention_scaling 1. A Gather in another order,
  // an Expand that broadcasts and a Mul by 1 that broadcasts stay.
  ExpectPassOutput(RunCanonicalize, R"(graph @mask(%m: i64[2,3], %c: f32[1,3,8], %r: f32[3,1]) {
  %idx: i64[2,1,1,3] = const [0, 1, 2, 3, 4, 5]
  %perm: i64[2,1,1,3] = const [1, 0, 2, 3, 4, 5]
  %shape: i64[5] = const [2, 1, 1, 3, 1]
  %wide: i64[2] = const [3, 4]
  %one: f32[] = const [1.0]
  %ones: f32[1,4] = const [1.0, 1.0, 1.0, 1.0]
  %f = Flatten(%m) {axis = 2}
  %g = Gather(%f, %idx) {axis = 0}
  %h = Gather(%f, %perm) {axis = 0}
  %e = Expand(%g, %shape)
  %n = Neg(%e)
  %x = Expand(%r, %wide)
  %cos = Cos(%c)
  %s = Mul(%cos, %one)
  %t = Exp(%s)
  %y = Mul(%r, %ones)
  return %n, %h, %t, %x, %y
})",
                   R"(
CHECK-NOT: Expand(%g
CHECK-NOT: Mul(%cos
CHECK: %h: i64[2,1,1,3,1] = Gather(%f, %perm) {axis = 0}
CHECK: %x: f32[3,4] = Expand(%r, %wide)
CHECK: %y: f32[3,4] = Mul(%r, %ones)
CHECK: %g: i64[2,1,1,3,1] = Reshape(%f, %{{[^)]*}})
CHECK-NEXT: %n: i64[2,1,1,3,1] = Neg(%g)
CHECK: return %n, %h, %t, %x, %y
)");
}

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

TEST(PassTextCanonicalize, SoftmaxWrittenOut) {
  ExpectPassOutput(RunCanonicalize, R"(graph @sm(%x: f32[2,16]) {
  %m = ReduceMax(%x) {axes = [-1], keepdims = 1}
  %d = Sub(%x, %m)
  %e = Exp(%d)
  %s = ReduceSum(%e) {axes = [-1], keepdims = 1}
  %y = Div(%e, %s)
  return %y
})",
                   R"(
CHECK: graph @sm(%x: f32[2,16]) {
CHECK-NEXT: %y: f32[2,16] = Softmax(%x) {
CHECK-SAME: axis = -1
CHECK-NEXT: return %y
)");
}

TEST(PassTextCanonicalize, LinearGemmBecomesMatMulAndBiasAdd) {
  ExpectPassOutput(RunCanonicalize, R"(graph @linear(%x: f32[2,3]) {
  %w: f32[2,3] = const [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
  %b: f32[2] = const [0.5, -0.5]
  %y = Gemm(%x, %w, %b) {transB = 1}
  return %y
})",
                   R"(
CHECK-NOT: Gemm(
CHECK: %b: f32[2] = const [0.5, -0.5]
CHECK-NEXT: %w_kn{{[_0-9]*}}: f32[3,2] = const [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
CHECK-NEXT: %{{[^:]*}}: f32[2,2] = MatMul(%x, %w_kn{{[_0-9]*}})
CHECK-NEXT: %y: f32[2,2] = Add(%{{[^,]*}}, %b)
CHECK-NEXT: return %y
)");
}

TEST(PassTextCanonicalize, NearMissesStay) {
  // The sigmoid is also returned: rewriting x * sigmoid(x) would drop it. GELU with 0.5001.
  ExpectPassOutput(RunCanonicalize, R"(graph @keep(%x: f32[4,16]) {
  %sqrt2: f32[] = const [1.4142135]
  %one: f32[] = const [1.0]
  %half: f32[] = const [0.5001]
  %s = Sigmoid(%x)
  %t = Mul(%x, %s)
  %d = Div(%t, %sqrt2)
  %e = Erf(%d)
  %a = Add(%e, %one)
  %m = Mul(%t, %a)
  %g = Mul(%m, %half)
  return %g, %s
})",
                   R"(
CHECK-NOT: Silu(
CHECK-NOT: Gelu(
CHECK: %s: f32[4,16] = Sigmoid(%x)
CHECK-NEXT: %t: f32[4,16] = Mul(%x, %s)
CHECK-NEXT: %d: f32[4,16] = Div(%t, %sqrt2)
CHECK-NEXT: %e: f32[4,16] = Erf(%d)
CHECK-NEXT: %a: f32[4,16] = Add(%e, %one)
CHECK-NEXT: %m: f32[4,16] = Mul(%t, %a)
CHECK-NEXT: %g: f32[4,16] = Mul(%m, %half)
CHECK-NEXT: return %g, %s
CHECK-NOT: Silu(
CHECK-NOT: Gelu(
)");
}

// ---- CanonicalizeViews ----

TEST(PassTextCanonicalizeViews, Conv1DViewsAroundTheGemmGoAway) {
  // transformers' Conv1D: x.view(-1, nx), addmm, .view(B, S, nf); then a residual add. The view
  // after the GEMM moves above the bias add and the MatMul, meets the one before and both go.
  ExpectPassOutput(RunCanonicalizeViews, R"(graph @conv1d(%x: f32[1,4,2], %r: f32[1,4,3]) {
  %w: f32[2,3] = const [1, 2, 3, 4, 5, 6]
  %b: f32[3] = const [0.5, -0.5, 1]
  %flat: i64[2] = const [-1, 2]
  %back: i64[3] = const [1, 4, 3]
  %x2 = Reshape(%x, %flat)
  %p = MatMul(%x2, %w)
  %y2 = Add(%p, %b)
  %y = Reshape(%y2, %back)
  %z = Add(%y, %r)
  return %z
})",
                   R"(
CHECK-NOT: Reshape(
CHECK: graph @conv1d(%x: f32[1,4,2], %r: f32[1,4,3]) {
CHECK: %{{[^:]*}}: f32[1,4,3] = MatMul(%x, %w)
CHECK-NEXT: %y: f32[1,4,3] = Add(%{{[^,]*}}, %b)
CHECK-NEXT: %z: f32[1,4,3] = Add(%y, %r)
CHECK-NEXT: return %z
CHECK-NOT: Reshape(
)");
}

TEST(PassTextCanonicalizeViews, ViewMovesAboveAnElementwiseChain) {
  // Both full-shape operands are viewed; the row bias and the scalar stay as they are.
  ExpectPassOutput(RunCanonicalizeViews, R"(graph @chain(%a: f32[6,4], %c: f32[6,4]) {
  %bias: f32[1,4] = const [1, 2, 3, 4]
  %two: f32[] = const [2.0]
  %shape: i64[3] = const [2, 3, 4]
  %s = Add(%a, %bias)
  %t = Mul(%s, %c)
  %u = Mul(%t, %two)
  %y = Reshape(%u, %shape)
  return %y
})",
                   R"(
CHECK: %c_view{{[_0-9]*}}: f32[2,3,4] = Reshape(%c, {{%[^)]*}})
CHECK-NEXT: %a_view{{[_0-9]*}}: f32[2,3,4] = Reshape(%a, {{%[^)]*}})
CHECK-NEXT: %s_view{{[_0-9]*}}: f32[2,3,4] = Add(%a_view{{[_0-9]*}}, %bias)
CHECK-NEXT: %t_view{{[_0-9]*}}: f32[2,3,4] = Mul(%s_view{{[_0-9]*}}, %c_view{{[_0-9]*}})
CHECK-NEXT: %y: f32[2,3,4] = Mul(%t_view{{[_0-9]*}}, %two)
CHECK-NEXT: return %y
)");
}

TEST(PassTextCanonicalizeViews, SplitOfAProjectionBecomesThreeProjections) {
  // GPT-2's c_attn(h).split(E, dim=2): each part is x times its columns of W plus its bias.
  ExpectPassOutput(RunCanonicalizeViews, R"(graph @qkv(%x: f32[1,2,2]) {
  %w: f32[2,6] = const [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
  %b: f32[6] = const [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
  %sizes: i64[3] = const [2, 2, 2]
  %p = MatMul(%x, %w)
  %y = Add(%b, %p)
  %q, %k, %v = Split(%y, %sizes) {axis = 2}
  return %q, %k, %v
})",
                   R"(
CHECK-NOT: Split(
CHECK: %w/cols0_2{{[_0-9]*}}: f32[2,2] = const [1.0, 2.0, 7.0, 8.0]
CHECK: %w/cols2_4{{[_0-9]*}}: f32[2,2] = const [3.0, 4.0, 9.0, 10.0]
CHECK: %w/cols4_6{{[_0-9]*}}: f32[2,2] = const [5.0, 6.0, 11.0, 12.0]
CHECK: = MatMul(%x, %w/cols0_2{{[_0-9]*}})
CHECK-NEXT: %q: f32[1,2,2] = Add(%b/cols0_2{{[_0-9]*}}, {{%[^)]*}})
CHECK: = MatMul(%x, %w/cols2_4{{[_0-9]*}})
CHECK-NEXT: %k: f32[1,2,2] = Add(%b/cols2_4{{[_0-9]*}}, {{%[^)]*}})
CHECK: = MatMul(%x, %w/cols4_6{{[_0-9]*}})
CHECK-NEXT: %v: f32[1,2,2] = Add(%b/cols4_6{{[_0-9]*}}, {{%[^)]*}})
CHECK-NEXT: return %q, %k, %v
CHECK-NOT: Split(
)");
}

TEST(PassTextCanonicalizeViews, SlicesOfAProjectionBecomeProjections) {
  // nn.MultiheadAttention's chunk(3, dim=-1), as Slices; a part that nothing reads goes.
  ExpectPassOutput(RunCanonicalizeViews, R"(graph @chunk(%x: f32[3,2,2]) {
  %w: f32[2,6] = const [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
  %s0: i64[1] = const [0]
  %s2: i64[1] = const [2]
  %s4: i64[1] = const [4]
  %s6: i64[1] = const [6]
  %last: i64[1] = const [-1]
  %p = MatMul(%x, %w)
  %q = Slice(%p, %s0, %s2, %last)
  %v = Slice(%p, %s4, %s6, %last)
  %k = Slice(%p, %s2, %s4, %last)
  %y = Add(%q, %k)
  return %y
})",
                   R"(
CHECK-NOT: Slice(
CHECK: %q: f32[3,2,2] = MatMul(%x, %w/cols0_2{{[_0-9]*}})
CHECK-NEXT: %k: f32[3,2,2] = MatMul(%x, %w/cols2_4{{[_0-9]*}})
CHECK-NEXT: %y: f32[3,2,2] = Add(%q, %k)
CHECK-NOT: Slice(
)");
}

TEST(PassTextCanonicalizeViews, NearMissesStay) {
  // A view that splits the last dim (a head split), a view of a value read elsewhere, slices
  // that read a column twice, a slice of a projection whose product is read elsewhere: all stay.
  ExpectPassOutput(RunCanonicalizeViews, R"(graph @keep(%x: f32[4,2]) {
  %w: f32[2,6] = const [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
  %heads: i64[3] = const [4, 3, 2]
  %rows: i64[3] = const [2, 2, 6]
  %s0: i64[1] = const [0]
  %s2: i64[1] = const [2]
  %s4: i64[1] = const [4]
  %last: i64[1] = const [-1]
  %p = MatMul(%x, %w)
  %h = Reshape(%p, %heads)
  %e = Exp(%p)
  %r = Reshape(%e, %rows)
  %n = Neg(%e)
  %a = Slice(%p, %s0, %s4, %last)
  %b = Slice(%p, %s2, %s4, %last)
  return %h, %r, %n, %a, %b
})",
                   R"(
CHECK: %p: f32[4,6] = MatMul(%x, %w)
CHECK-NEXT: %h: f32[4,3,2] = Reshape(%p, %heads)
CHECK-NEXT: %e: f32[4,6] = Exp(%p)
CHECK-NEXT: %r: f32[2,2,6] = Reshape(%e, %rows)
CHECK-NEXT: %n: f32[4,6] = Neg(%e)
CHECK-NEXT: %a: f32[4,4] = Slice(%p, %s0, %s4, %last)
CHECK-NEXT: %b: f32[4,2] = Slice(%p, %s2, %s4, %last)
CHECK-NEXT: return %h, %r, %n, %a, %b
)");
}

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

TEST(PassTextFuseAttention, MultiheadAttentionLayoutWithScaledQ) {
  // nn.MultiheadAttention (batch_first=False): x (S=4, B=2, E=4), 2 heads of 2; heads as
  // (S, B*H, d) transposed to (B*H, S, d), q divided by sqrt(d) before the scores, bmm, the
  // heads merged back to (S*B, E). The node reads q, k, v as they are: B*H = 4 heads of bshd.
  ExpectPassOutput(RunFuseAttention, R"(graph @mha(%q: f32[4,2,4], %k: f32[4,2,4], %v: f32[4,2,4]) {
  %shape: i64[3] = const [4, 4, 2]
  %oshape: i64[2] = const [8, 4]
  %c: f32[] = const [2.0]
  %qr = Reshape(%q, %shape)
  %q3 = Transpose(%qr) {perm = [1, 0, 2]}
  %qs = Div(%q3, %c)
  %kr = Reshape(%k, %shape)
  %kt = Transpose(%kr) {perm = [1, 2, 0]}
  %vr = Reshape(%v, %shape)
  %v3 = Transpose(%vr) {perm = [1, 0, 2]}
  %s = MatMul(%qs, %kt)
  %p = Softmax(%s) {axis = -1}
  %o3 = MatMul(%p, %v3)
  %ot = Transpose(%o3) {perm = [1, 0, 2]}
  %out = Reshape(%ot, %oshape)
  return %out
})",
                   R"(
CHECK: %out: f32[8,4] = FusedAttention(%q, %k, %v) {batch = 1, has_mask = 0, head_dim = 2, heads = 4,
CHECK-SAME: k_layout = "bshd"
CHECK-SAME: out_layout = "bshd", output_shape = [8, 4], q_layout = "bshd"
CHECK: %qs: f32[4,4,2] = Div(%q3, %c)
CHECK: %s: f32[4,4,4] = MatMul(%qs, %kt)
CHECK: }, rope_k = 0, rope_q = 0, scale = 0.5, seq_k = 4, seq_q = 4, v_head_dim = 2, v_layout = "bshd"}
CHECK-NEXT: return %out
)");
}

TEST(PassTextFuseAttention, MergedHeadsReadAsGiven) {
  // [B*H, S, d] operands with nothing to absorb: read in place as bhsd (K^T as bhds).
  ExpectPassOutput(RunFuseAttention, R"(graph @bmm(%q: f32[3,4,2], %kt: f32[3,2,5], %v: f32[3,5,2]) {
  %c: f32[] = const [0.5]
  %s = MatMul(%q, %kt)
  %s1 = Mul(%s, %c)
  %p = Softmax(%s1) {axis = 2}
  %o = MatMul(%p, %v)
  return %o
})",
                   R"(
CHECK: %o: f32[3,4,2] = FusedAttention(%q, %kt, %v) {batch = 1,
CHECK-SAME: heads = 3
CHECK-SAME: k_layout = "bhds"
CHECK-SAME: out_layout = "bhsd", output_shape = [3, 4, 2], q_layout = "bhsd"
CHECK: }, rope_k = 0, rope_q = 0, scale = 0.5, seq_k = 5, seq_q = 4, v_head_dim = 2, v_layout = "bhsd"}
CHECK-NEXT: return %o
)");
}

// ---- FuseElementwise ----

TEST(PassTextFuseElementwise, ChainWithBroadcastOperandsIsOneGroup) {
  ExpectPassOutput(RunFuseElementwise, R"(graph @chain(%x: f32[4,8], %y: f32[4,8], %b: f32[8]) {
  %s: f32[] = const [0.125]
  %0 = Add(%x, %y)
  %1 = Mul(%0, %s)
  %u = Add(%1, %b)
  return %u
})",
                   R"(
CHECK: %s: f32[] = const [0.125]
CHECK-NEXT: %u: f32[4,8] = FusedElementwise(%x, %y, %s, %b) {body = graph @fused_0(%in0: f32[4,8], %in1: f32[4,8], %in2: f32[], %in3: f32[8]) {
CHECK-NEXT: %0: f32[4,8] = Add(%in0, %in1)
CHECK-NEXT: %1: f32[4,8] = Mul(%0, %in2)
CHECK-NEXT: %u: f32[4,8] = Add(%1, %in3)
CHECK-NEXT: return %u
CHECK-NEXT: }, kernel_name = "fused_add_mul_add_f32_{{[0-9a-f]{8}}}"}
CHECK-NEXT: return %u
)");
}

TEST(PassTextFuseElementwise, ValueReadOutsideTheGroupIsASecondOutput) {
  ExpectPassOutput(RunFuseElementwise, R"(graph @m(%x: f32[4,4], %y: f32[4,4], %w: f32[4,4]) {
  %t = Add(%x, %y)
  %r = Relu(%t)
  %m = MatMul(%t, %w)
  return %r, %m
})",
                   R"(
CHECK: graph @m(
CHECK-NEXT: %t: f32[4,4], %r: f32[4,4] = FusedElementwise(%x, %y) {body = graph @fused_0(
CHECK-NEXT: %t: f32[4,4] = Add(%in0, %in1)
CHECK-NEXT: %r: f32[4,4] = Relu(%t)
CHECK-NEXT: return %t, %r
CHECK-NEXT: }, kernel_name = "fused_add_relu_f32_{{[0-9a-f]{8}}}"
CHECK-NEXT: %m: f32[4,4] = MatMul(%t, %w)
CHECK-NEXT: return %r, %m
)");
}

TEST(PassTextFuseElementwise, SiblingsReadingOneInputMerge) {
  ExpectPassOutput(RunFuseElementwise, R"(graph @h(%x: f32[2,8], %bq: f32[8], %bk: f32[8], %bv: f32[8]) {
  %q = Add(%x, %bq)
  %k = Add(%x, %bk)
  %v = Add(%x, %bv)
  return %q, %k, %v
})",
                   R"(
CHECK: graph @h(
CHECK-NEXT: %q: f32[2,8], %k: f32[2,8], %v: f32[2,8] = FusedElementwise(%x, %bq, %bk, %bv) {body = graph @fused_0(
CHECK-NEXT: %q: f32[2,8] = Add(%in0, %in1)
CHECK-NEXT: %k: f32[2,8] = Add(%in0, %in2)
CHECK-NEXT: %v: f32[2,8] = Add(%in0, %in3)
CHECK-NEXT: return %q, %k, %v
CHECK-NEXT: }, kernel_name = "fused_add_add_add_f32_{{[0-9a-f]{8}}}"}
CHECK-NEXT: return %q, %k, %v
)");
}

TEST(PassTextFuseElementwise, CycleThroughAnOutsideNodeIsRefused) {
  // Neg and Add in one kernel would run both before and after the MatMul between them.
  ExpectPassOutput(RunFuseElementwise, R"(graph @c(%x: f32[4,4], %w: f32[4,4]) {
  %a = Neg(%x)
  %c = MatMul(%a, %w)
  %b = Add(%a, %c)
  return %b
})",
                   R"(
CHECK-NOT: FusedElementwise
CHECK: %a: f32[4,4] = Neg(%x)
CHECK-NEXT: %c: f32[4,4] = MatMul(%a, %w)
CHECK-NEXT: %b: f32[4,4] = Add(%a, %c)
CHECK-NOT: FusedElementwise
)");
}

TEST(PassTextFuseElementwise, OtherSpacesAndDomainsStayApart) {
  // Exp over [8] and the Add over [4,8]: different spaces; the integer Add: another domain.
  ExpectPassOutput(RunFuseElementwise, R"(graph @s(%x: f32[4,8], %v: f32[8], %i: i32[4,8], %j: i32[4,8]) {
  %a = Exp(%v)
  %b = Add(%x, %a)
  %c = Add(%i, %j)
  %d = Cast(%c) {to = 0}
  %e = Mul(%b, %d)
  return %e
})",
                   R"(
CHECK: %a: f32[8] = Exp(%v)
CHECK-NEXT: %d: f32[4,8] = FusedElementwise(%i, %j) {body = graph @fused_1(%in0: i32[4,8], %in1: i32[4,8]) {
CHECK-NEXT: %c: i32[4,8] = Add(%in0, %in1)
CHECK-NEXT: %d: f32[4,8] = Cast(%c) {to = 0}
CHECK-NEXT: return %d
CHECK-NEXT: }, kernel_name = "fused_add_cast_f32_{{[0-9a-f]{8}}}"}
CHECK-NEXT: %e: f32[4,8] = FusedElementwise(%x, %a, %d) {body = graph @fused_0(
CHECK-NEXT: %b: f32[4,8] = Add(%in0, %in1)
CHECK-NEXT: %e: f32[4,8] = Mul(%b, %in2)
CHECK-NEXT: return %e
CHECK-NEXT: }, kernel_name = "fused_add_mul_f32_{{[0-9a-f]{8}}}"}
CHECK-NEXT: return %e
)");
}

// ---- FuseGemm ----

// Projections of one input with the same width: one GEMM over the weights side by side.
TEST(PassTextFuseGemm, ProjectionsOfOneInputBecomeOneGemm) {
  ExpectPassOutput(RunFuseGemm, R"(graph @qkv(%x: f32[2,4]) {
  %wq: f32[4,2] = const [1, 2, 3, 4, 5, 6, 7, 8]
  %wk: f32[4,2] = const [10, 20, 30, 40, 50, 60, 70, 80]
  %wv: f32[4,2] = const [-1, -2, -3, -4, -5, -6, -7, -8]
  %q = MatMul(%x, %wq)
  %k = MatMul(%x, %wk)
  %v = MatMul(%x, %wv)
  return %q, %k, %v
})",
                   R"(
CHECK-NOT: MatMul(%x
CHECK: %MatMul_0_weights_x3{{[_0-9]*}}: f32[4,6] = const [1.0, 2.0, 10.0, 20.0, -1.0, -2.0, 3.0, 4.0, 30.0, 40.0, -3.0, -4.0,
CHECK-NEXT: %q: f32[2,2], %k: f32[2,2], %v: f32[2,2] = FusedGemm(%x, %MatMul_0_weights_x3{{[_0-9]*}}) {
CHECK-SAME: kernel_name = "gemm_2x6x4_split3_f32_{{[0-9a-f]{8}}}", out_proj = [0, 1, 2]
CHECK-SAME: reference = graph @reference(%a: f32[2,4], %w: f32[4,6]) {
CHECK: = Slice(%w, {{.*}}
CHECK-NEXT: = MatMul(%a, {{.*}}
CHECK-NEXT: = Slice(%w, {{.*}}
CHECK-NEXT: = MatMul(%a, {{.*}}
CHECK-NEXT: = Slice(%w, {{.*}}
CHECK-NEXT: = MatMul(%a, {{.*}}
CHECK: }, splits = 3}
CHECK-NEXT: return %q, %k, %v
)");
}

TEST(PassTextFuseGemm, BiasAddRunsAsTheEpilogue) {
  // The Add reads the projection: it runs in the GEMM. The Relu reads the Add, not the GEMM:
  // it stays.
  ExpectPassOutput(RunFuseGemm, R"(graph @linear(%x: f32[2,4]) {
  %w: f32[4,2] = const [1, 2, 3, 4, 5, 6, 7, 8]
  %b: f32[2] = const [0.5, -0.5]
  %p = MatMul(%x, %w)
  %y = Add(%p, %b)
  %z = Relu(%y)
  return %z
})",
                   R"(
CHECK: %y: f32[2,2] = FusedGemm(%x, %w, %b) {epilogue = graph @epilogue(%p0: f32[2,2], %in0: f32[2]) {
CHECK-NEXT: = Add(%p0, %in0)
CHECK-NEXT: return
CHECK-NEXT: }, kernel_name = "gemm_2x2x4_add_f32_{{[0-9a-f]{8}}}", out_proj = [-1], reference = graph @reference(
CHECK-NEXT: = MatMul(%a, %w)
CHECK-NEXT: = Add({{%[^,]*}}, %in0)
CHECK: }, splits = 1}
CHECK-NEXT: %z: f32[2,2] = Relu(%y)
)");
}

TEST(PassTextFuseGemm, GatedReaderOfTheEpilogueStaysOutside) {
  // Silu(gate) runs as the epilogue of the gate/up GEMM; the Mul reads the Silu's result (another
  // member's), so alone this pass leaves it outside, reading both results.
  ExpectPassOutput(RunFuseGemm, R"(graph @swiglu(%h: f32[2,4]) {
  %wg: f32[4,2] = const [1, 2, 3, 4, 5, 6, 7, 8]
  %wu: f32[4,2] = const [8, 7, 6, 5, 4, 3, 2, 1]
  %gate = MatMul(%h, %wg)
  %up = MatMul(%h, %wu)
  %act = Silu(%gate)
  %y = Mul(%act, %up)
  return %y
})",
                   R"(
CHECK: %up: f32[2,2], %act: f32[2,2] = FusedGemm(%h, {{%[^,]*}}) {epilogue = graph @epilogue(%p0: f32[2,2], %p1: f32[2,2]) {
CHECK-NEXT: = Silu(%p0)
CHECK-NOT: Mul(
CHECK: kernel_name = "gemm_2x4x4_split2_silu_f32_{{[0-9a-f]{8}}}", out_proj = [1, -1]
CHECK: %y: f32[2,2] = Mul(%act, %up)
)");
}

TEST(PassTextFuseGemm, LoneGemmAndNonConstantWeightsAreLeftAlone) {
  ExpectPassOutput(RunFuseGemm, R"(graph @g(%x: f32[2,4], %wdyn: f32[4,2]) {
  %w: f32[4,2] = const [1, 2, 3, 4, 5, 6, 7, 8]
  %p = MatMul(%x, %w)
  %d = MatMul(%x, %wdyn)
  %e = Tanh(%d)
  return %p, %e
})",
                   R"(
CHECK-NOT: FusedGemm
CHECK: %p: f32[2,2] = MatMul(%x, %w)
CHECK-NEXT: %d: f32[2,2] = MatMul(%x, %wdyn)
CHECK-NEXT: %e: f32[2,2] = Tanh(%d)
CHECK-NOT: FusedGemm
)");
}

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

TEST(PassTextFuseRowwise, ResidualAddRmsNormAlsoEmitsTheSum) {
  // h = x + r is normalized and read again after the MatMul: a second output of the row kernel.
  ExpectPassOutput(RunFuseRowwise, R"(graph @block(%x: f32[4,8], %r: f32[4,8], %w: f32[8], %wm: f32[8,8]) {
  %h = Add(%x, %r)
  %y = RMSNorm(%h, %w) {epsilon = 0.00001}
  %m = MatMul(%y, %wm)
  %out = Add(%m, %h)
  return %out
})",
                   R"(
CHECK: graph @block(
CHECK-NEXT: %y: f32[4,8], %h: f32[4,8] = FusedNorm(%x, %r, %w) {body = graph @fused_norm_0(%x: f32[4,8], %r: f32[4,8]) {
CHECK-NEXT: %h: f32[4,8] = Add(%x, %r)
CHECK-NEXT: return %h
CHECK-NEXT: }, epsilon = 9.99999975e-06, kernel_name = "rmsnorm_prologue_add_f32_{{[0-9a-f]{8}}}", norm = "RMSNorm",
CHECK-SAME: prologue_outputs = 1, reference = graph
CHECK-NEXT: %h: f32[4,8] = Add(%x, %r)
CHECK-NEXT: %y: f32[4,8] = RMSNorm(%h, %w)
CHECK-NEXT: return %y, %h
CHECK: %m: f32[4,8] = MatMul(%y, %wm)
CHECK-NEXT: %out: f32[4,8] = Add(%m, %h)
)");
}

TEST(PassTextFuseRowwise, LayerNormWithBiasPrologue) {
  ExpectPassOutput(RunFuseRowwise, R"(graph @ln(%a: f32[2,3,8], %b: f32[8], %g: f32[8], %beta: f32[8]) {
  %h = Add(%a, %b)
  %y = LayerNormalization(%h, %g, %beta) {axis = -1, epsilon = 0.00001}
  return %y
})",
                   R"(
CHECK: graph @ln(
CHECK-NEXT: %y: f32[2,3,8] = FusedNorm(%a, %b, %g, %beta) {body = graph @fused_norm_0(%a: f32[2,3,8], %b: f32[8]) {
CHECK-NEXT: %h: f32[2,3,8] = Add(%a, %b)
CHECK: kernel_name = "layernorm_prologue_add_f32_{{[0-9a-f]{8}}}", norm = "LayerNormalization"
CHECK-SAME: prologue_outputs = 0, reference = graph
CHECK-NEXT: %h: f32[2,3,8] = Add(%a, %b)
CHECK-NEXT: %y: f32[2,3,8] = LayerNormalization(%h, %g, %beta)
CHECK: }}
CHECK-NEXT: return %y
)");
}

TEST(PassTextFuseRowwise, SoftmaxWithMaskPrologueAndDropoutEpilogue) {
  ExpectPassOutput(RunFuseRowwise, R"(graph @s(%x: f32[2,4,4], %mask: f32[1,4,4], %keep: f32[2,4,4]) {
  %0 = Add(%x, %mask)
  %a = Softmax(%0) {axis = -1}
  %p = Mul(%a, %keep)
  return %p
})",
                   R"(
CHECK: graph @s(
CHECK-NEXT: %p: f32[2,4,4] = FusedSoftmax(%x, %mask, %keep) {epilogue = graph @fused_softmax_0_epilogue(%a: f32[2,4,4], %keep: f32[2,4,4]) {
CHECK-NEXT: %p: f32[2,4,4] = Mul(%a, %keep)
CHECK: kernel_name = "softmax_prologue_add_epilogue_mul_f32_{{[0-9a-f]{8}}}", prologue = graph @fused_softmax_0_prologue(%x: f32[2,4,4], %mask: f32[1,4,4]) {
CHECK-NEXT: %0: f32[2,4,4] = Add(%x, %mask)
CHECK: reference = graph
CHECK: }, softmax_input = 0}
CHECK-NEXT: return %p
)");
}

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
