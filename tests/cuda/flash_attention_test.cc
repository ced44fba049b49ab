// The flash-style prefill attention kernel (GenerateFlashAttentionKernel): compiled through
// NVRTC in f32, f16 and bf16 and for every mask kind; run on the host (host_emulation.h)
// against the CPU's FusedAttention on random data (never zeros) over sequence lengths on and
// off the tile sizes, grouped K / V heads, two head widths, causal and padding masks (batch
// entries padded differently, rows whose every key is masked), RoPE and the layouts; and
// chosen by the plan for prefill, through the emulated CUDA executor on the exported blocks.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "../graph_test_util.h"
#include "cuda/codegen.h"
#include "cuda/cuda_executor.h"
#include "cuda/cuda_target.h"
#include "cuda/host_emulation.h"
#include "cuda/nvrtc_compile.h"
#include "cpu/executor.h"
#include "ir/text.h"
#include "expect_close.h"
#include "narrow_twin.h"
#include "onnx/import.h"
#include "passes/convert_precision.h"
#include "passes/pipeline.h"

namespace graphfuse::cuda {
namespace {

enum class MaskKind {
  kNone,
  kCausal,        // f32 constant [1,1,S,S]: -inf above the diagonal
  kCausalPadded,  // f32 constant [B,1,S,S]: -1e9 above the diagonal and on batch b's first 3b keys
                  // (its first rows then have every key masked)
  kPaddingBool,   // bool input [B,1,1,S]: batch b keeps its first S - 2b keys, fill -1e9
  kPaddingF32,    // f32 input [B,1,1,S] (random data, padded keys -1e4 * mask_scale 2)
  kCausalBool,    // bool constant [1,1,S,S]: keeps j <= r, fill -3.4e38
  kCausalLeftPad, // f32 constant [B,1,S,S]: -inf above the diagonal and on batch b's first 3b keys
                  // (left padding: its first 3b rows have every key at -inf, a NaN softmax)
};

const char* MaskName(MaskKind m) {
  switch (m) {
    case MaskKind::kNone: return "no mask";
    case MaskKind::kCausal: return "causal";
    case MaskKind::kCausalPadded: return "causal + padding";
    case MaskKind::kPaddingBool: return "bool padding";
    case MaskKind::kPaddingF32: return "f32 padding";
    case MaskKind::kCausalBool: return "bool causal";
    case MaskKind::kCausalLeftPad: return "causal + left padding at -inf";
  }
  return "?";
}

struct FlashCase {
  int64_t b = 1, h = 4, kv = 4, s = 17, d = 16;
  MaskKind mask = MaskKind::kNone;
  bool rope = false;
  bool bshd = false;  // q, k, v and the output as [B, S, H*d] (else [B, H, S, d]; K as K^T [B, H, d, S])
  bool guard = false;  // zero_nan_rows: the softmax's Where(IsNaN(P), 0, P) guard absorbed
};

std::string Label(const FlashCase& c) {
  return StrCat("b ", c.b, ", heads ", c.h, "/", c.kv, ", seq ", c.s, ", head_dim ", c.d, ", ", MaskName(c.mask),
                c.rope ? ", RoPE" : "", c.bshd ? ", bshd" : c.rope ? ", bhsd" : ", bhsd with K^T",
                c.guard ? ", NaN rows zeroed" : "");
}

std::string Values(int64_t n, const std::function<std::string(int64_t)>& at) {
  std::string t = "[";
  for (int64_t i = 0; i < n; ++i) t += (i ? ", " : "") + at(i);
  return t + "]";
}

// A graph of one FusedAttention node as `c` describes it.
std::string FlashGraphText(const FlashCase& c) {
  const int64_t b = c.b, h = c.h, kv = c.kv, s = c.s, d = c.d;
  const bool kt_layout = !c.bshd && !c.rope;  // RoPE on K reads K's rows
  auto shape = [&](int64_t heads, bool kt) {
    kt = kt && kt_layout;
    if (c.bshd) return StrCat("f32[", b, ",", s, ",", heads * d, "]");
    return kt ? StrCat("f32[", b, ",", heads, ",", d, ",", s, "]") : StrCat("f32[", b, ",", heads, ",", s, ",", d, "]");
  };
  std::string ins = StrCat("%q: ", shape(h, false), ", %k: ", shape(kv, true), ", %v: ", shape(kv, false));
  std::string consts, args = "%q, %k, %v";
  std::string attrs = StrCat("batch = ", b, ", heads = ", h, ", kv_heads = ", kv, ", seq_q = ", s, ", seq_k = ", s,
                             ", head_dim = ", d, ", scale = 0.3");
  const char* lay = c.bshd ? "\"bshd\"" : "\"bhsd\"";
  attrs += StrCat(", q_layout = ", lay, ", k_layout = ", kt_layout ? "\"bhds\"" : lay, ", v_layout = ", lay,
                  ", out_layout = ", lay);
  attrs += c.bshd ? StrCat(", output_shape = [", b, ", ", s, ", ", h * d, "]")
                  : StrCat(", output_shape = [", b, ", ", h, ", ", s, ", ", d, "]");
  switch (c.mask) {
    case MaskKind::kNone: break;
    case MaskKind::kCausal:
      consts += StrCat("  %mask: f32[1,1,", s, ",", s, "] = const ",
                       Values(s * s, [&](int64_t i) { return i % s > i / s ? std::string("-inf") : std::string("0"); }),
                       "\n");
      args += ", %mask", attrs += ", has_mask = 1";
      break;
    case MaskKind::kCausalPadded:
    case MaskKind::kCausalLeftPad: {
      const std::string fill = c.mask == MaskKind::kCausalPadded ? "-1e9" : "-inf";
      consts += StrCat("  %mask: f32[", b, ",1,", s, ",", s, "] = const ", Values(b * s * s, [&](int64_t i) {
                         const int64_t bb = i / (s * s), r = i / s % s, j = i % s;
                         return j > r || j < 3 * bb ? fill : std::string("0");
                       }),
                       "\n");
      args += ", %mask", attrs += ", has_mask = 1";
      break;
    }
    case MaskKind::kPaddingBool:
      ins += StrCat(", %bm: bool[", b, ",1,1,", s, "]");
      args += ", %bm", attrs += ", mask_select = 1, mask_fill = -1e9";
      break;
    case MaskKind::kPaddingF32:
      ins += StrCat(", %mask: f32[", b, ",1,1,", s, "]");
      args += ", %mask", attrs += ", has_mask = 1, mask_scale = 2.0";
      break;
    case MaskKind::kCausalBool:
      consts += StrCat("  %bm: bool[1,1,", s, ",", s, "] = const ",
                       Values(s * s, [&](int64_t i) { return i % s > i / s ? std::string("0") : std::string("1"); }),
                       "\n");
      args += ", %bm", attrs += ", mask_select = 1, mask_fill = -3.4e38";
      break;
  }
  if (c.rope) {
    ins += StrCat(", %cos: f32[", s, ",", d, "], %sin: f32[", s, ",", d, "]");
    args += ", %cos, %sin", attrs += ", rope_q = 1, rope_k = 1";
  }
  if (c.guard) attrs += ", zero_nan_rows = 1";
  return StrCat("graph @flash(", ins, ") {\n", consts, "  %o = FusedAttention(", args, ") {", attrs,
                "}\n  return %o\n}");
}

// Random inputs, never zero; masks: a bool padding mask drops batch b's last 2b keys; an f32
// padding mask holds -1e4 there (random elsewhere).
std::vector<Tensor> FlashInputs(const Graph& g, const FlashCase& c, uint32_t seed) {
  return RandomInputs(g, seed, 0.05, 1.0, [&](const Value& v, int64_t i, std::mt19937&) -> std::optional<double> {
    const int64_t bb = i / c.s, j = i % c.s;
    if (v.dtype() == DType::kBool) return j < c.s - 2 * bb ? 1.0 : 0.0;
    if (v.name() == "mask" && j >= c.s - 2 * bb) return -1e4;
    return std::nullopt;
  });
}

const Node* OnlyAttention(const Graph& g) {
  for (const auto& n : g.nodes())
    if (n->op() == "FusedAttention") return n.get();
  return nullptr;
}

// The flash kernel of c's node in dtype dt, run on the host, against the CPU's f32
// FusedAttention on the same (rounded) inputs.
void CheckFlash(const FlashCase& c, DType dt, uint32_t seed) {
  const std::string label = StrCat(Label(c), " in ", DTypeName(dt));
  SCOPED_TRACE(label);
  auto g = ParseGraph(FlashGraphText(c));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Node* fa = OnlyAttention(**g);
  ASSERT_NE(fa, nullptr);
  // The node's operands in input order: the graph's random inputs, or its constants (a causal
  // mask); in dt, and the same values in f32 for the CPU.
  const std::vector<Tensor> ins = FlashInputs(**g, c, seed);
  std::vector<Tensor> narrow, widened;
  for (const Value* v : fa->inputs()) {
    const auto& gi = (*g)->inputs();
    const size_t at = static_cast<size_t>(std::find(gi.begin(), gi.end(), v) - gi.begin());
    ASSERT_TRUE(v->constant() || at < ins.size());
    const Tensor& t = v->constant() ? *v->constant() : ins[at];
    narrow.push_back(IsFloat(t.dtype()) ? ConvertedTo(t, dt) : ConvertedTo(t, t.dtype()));
    widened.push_back(IsFloat(t.dtype()) ? ConvertedTo(narrow.back(), DType::kF32) : ConvertedTo(t, t.dtype()));
  }
  auto wide = NarrowTwin(*fa, DType::kF32);  // the node alone, every operand an input
  ASSERT_TRUE(wide.ok()) << wide.status().ToString();
  auto want = Execute(*wide->graph, Views(widened), CpuContext{});
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  // The f32 kernel from the node itself (its constant mask can leave key tiles out); f16 / bf16
  // from its twin in that dtype.
  const Node* node = fa;
  std::optional<NodeTwin> twin;
  if (dt != DType::kF32) {
    auto t = NarrowTwin(*fa, dt);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    twin = std::move(*t);
    node = twin->node;
  }
  auto k = GenerateFlashAttentionKernel(*node);
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(k->name.rfind("flash_attention", 0), 0u) << k->name;
  const bool causal = dt == DType::kF32 && (c.mask == MaskKind::kCausal || c.mask == MaskKind::kCausalPadded ||
                                            c.mask == MaskKind::kCausalBool || c.mask == MaskKind::kCausalLeftPad);
  // A constant mask that drops the last keys of some row (every causal case: s > 1) gives the
  // kernel that tests at run time whether a key tile can be left out, whatever the length, so
  // that every length shares its source; the name says so, and gives the tiles.
  const size_t at = k->name.find("_bc");
  ASSERT_NE(at, std::string::npos) << k->name;
  EXPECT_EQ(k->name.find("_causal_") != std::string::npos, causal && c.s > 1) << k->name;
  auto host = HostKernel::Build(*k);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  std::vector<void*> args;
  for (Tensor& t : narrow) args.push_back(t.data());
  Tensor got = Tensor::Empty(dt, (*want)[0].shape()).value();
  std::memset(got.data(), 0xff, got.nbytes());  // NaN where nothing is written
  args.push_back(got.data());
  (*host)->Launch(args, k->sizes, 3);
  const double rtol = dt == DType::kF32 ? 1e-4 : dt == DType::kF16 ? 2e-3 : 1e-2;
  const double worst = ExpectClose(got, (*want)[0], rtol, dt == DType::kF32 ? 1e-5 : 1e-6, label);
  if (c.mask == MaskKind::kCausalLeftPad) {
    // Rows r < 3b of batch b see no key: 0 with the guard, as PyTorch's SDPA gives, NaN without
    // (the CPU's too, which ExpectClose compared); every other row is finite.
    int64_t dead = 0, wrong = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      const int64_t bb = c.bshd ? i / (c.s * c.h * c.d) : i / (c.h * c.s * c.d);
      const int64_t r = c.bshd ? i / (c.h * c.d) % c.s : i / c.d % c.s;
      const double x = got.GetAsDouble(i);
      const bool is_dead = r < 3 * bb;
      dead += is_dead;
      wrong += is_dead ? (c.guard ? x != 0.0 : !std::isnan(x)) : !std::isfinite(x);
    }
    EXPECT_GT(dead, 0);
    EXPECT_EQ(wrong, 0) << "rows masked everywhere must be " << (c.guard ? "0" : "NaN") << ", the others finite";
  }
  std::printf("[ emulated ] %s: %s, max |err| vs CPU %.2g\n", label.c_str(), k->name.c_str(), worst);
}

TEST(FlashAttention, EmulatedMatchesTheCpuAcrossShapesAndMasks) {
  // Sequence lengths 1, 17, 64 (two tiles of 32) and 130 (off every tile size); 4 heads over 4
  // and 2 K / V heads; head_dim 16 and 64; each mask kind; batch 2 padded differently per entry.
  const FlashCase cases[] = {
      {1, 4, 4, 1, 16, MaskKind::kNone},
      {2, 4, 2, 1, 64, MaskKind::kPaddingBool},
      {1, 4, 4, 17, 16, MaskKind::kCausal},
      {2, 4, 2, 17, 64, MaskKind::kPaddingF32},
      {1, 4, 2, 64, 16, MaskKind::kCausal, true},
      {2, 4, 4, 64, 64, MaskKind::kCausalPadded},
      {2, 4, 2, 64, 16, MaskKind::kPaddingBool, false, true},
      {1, 4, 4, 64, 16, MaskKind::kCausalBool, false, true},
      {1, 4, 4, 130, 16, MaskKind::kNone, true, true},
      {1, 4, 2, 130, 64, MaskKind::kCausal},
      {2, 4, 2, 130, 16, MaskKind::kCausalPadded, true},
      {2, 4, 4, 130, 16, MaskKind::kPaddingF32, false, true},
      {1, 4, 2, 130, 16, MaskKind::kCausalBool},
  };
  uint32_t seed = 100;
  for (const FlashCase& c : cases) CheckFlash(c, DType::kF32, seed++);
}

// Left padding under a causal mask at -inf: the padded rows see no key. With the softmax's NaN
// guard absorbed (zero_nan_rows) they are 0 on the emulated kernel and the CPU alike, across
// tile boundaries and key tiles left out; without it NaN on both.
TEST(FlashAttention, RowsMaskedEverywhereFollowTheNaNGuard) {
  uint32_t seed = 150;
  for (const bool guard : {true, false}) {
    FlashCase cases[] = {
        {2, 4, 2, 17, 16, MaskKind::kCausalLeftPad},
        {3, 4, 4, 70, 16, MaskKind::kCausalLeftPad, true, true},
        {2, 4, 2, 40, 64, MaskKind::kCausalLeftPad, false, true},
    };
    for (FlashCase& c : cases) {
      c.guard = guard;
      CheckFlash(c, DType::kF32, seed++);
    }
    FlashCase narrow{2, 4, 2, 33, 16, MaskKind::kCausalLeftPad};
    narrow.guard = guard;
    for (DType dt : {DType::kF16, DType::kBF16}) CheckFlash(narrow, dt, seed++);
  }
}

TEST(FlashAttention, EmulatedInF16AndBf16MatchesTheCpuOnRoundedInputs) {
  const FlashCase cases[] = {
      {2, 4, 2, 40, 16, MaskKind::kCausalPadded, true},
      {1, 4, 4, 33, 64, MaskKind::kPaddingBool, false, true},
  };
  uint32_t seed = 200;
  for (const FlashCase& c : cases)
    for (DType dt : {DType::kF16, DType::kBF16}) CheckFlash(c, dt, seed++);
}

// A head wider than 128 takes tiles of 16 rows.
TEST(FlashAttention, WideHeadsTakeSixteenRowTiles) {
  CheckFlash({1, 2, 2, 40, 160, MaskKind::kCausal}, DType::kF32, 300);
}

TEST(FlashAttention, CompilesThroughNvrtcForEveryMaskAndDtype) {
  NvrtcCompiler compiler;
  for (MaskKind m : {MaskKind::kNone, MaskKind::kCausal, MaskKind::kCausalPadded, MaskKind::kPaddingBool,
                     MaskKind::kPaddingF32, MaskKind::kCausalBool}) {
    const FlashCase c{2, 4, 2, 70, 64, m, true};
    auto g = ParseGraph(FlashGraphText(c));
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(StrCat(Label(c), " in ", DTypeName(dt)));
      const Node* fa = OnlyAttention(**g);
      std::optional<NodeTwin> twin;
      if (dt != DType::kF32) {
        auto t = NarrowTwin(*fa, dt);
        ASSERT_TRUE(t.ok()) << t.status().ToString();
        twin = std::move(*t);
        fa = twin->node;
      }
      auto k = GenerateFlashAttentionKernel(*fa);
      ASSERT_TRUE(k.ok()) << k.status().ToString();
      auto ptx = compiler.Compile(*k);
      ASSERT_TRUE(ptx.ok()) << ptx.status().ToString() << "\n" << k->source;
    }
  }
}

// The key tiles a causal mask drops are left out: the kernel, with a counter added where it
// leaves a tile out, counts them over 130 rows of 4 heads (query tiles of 32 rows, key tiles of
// 64: the query tiles leave out 2, 2, 1, 1 and 0 key tiles), and still matches the CPU. Under a
// mask of -1e9 rather than -inf, rows whose every key is masked (batch 1's first 3) keep their
// query tile's key tiles in: their softmax spreads over every key, as on the CPU.
TEST(FlashAttention, CausalMaskLeavesKeyTilesOut) {
  struct Skips {
    FlashCase c;
    int64_t tiles;
  } cases[] = {{{1, 4, 4, 130, 16, MaskKind::kCausal}, 4 * 6},
               {{2, 4, 4, 130, 16, MaskKind::kCausalPadded}, 4 * 6 + 4 * 4},
               {{1, 4, 2, 130, 16, MaskKind::kCausalBool}, 4 * 6}};
  for (const Skips& sk : cases) {
    const FlashCase& c = sk.c;
    SCOPED_TRACE(Label(c));
    auto g = ParseGraph(FlashGraphText(c));
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    const Node* fa = OnlyAttention(**g);
    auto k = GenerateFlashAttentionKernel(*fa);
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    ASSERT_NE(k->name.find("_bc64_causal_"), std::string::npos) << k->name;
    const std::string counted = k->name + "_counted";
    std::string src = k->source;
    const size_t name_at = src.find(k->name);
    ASSERT_NE(name_at, std::string::npos);
    src.replace(name_at, k->name.size(), counted);
    const std::string skip = "if (skip) continue;";
    const size_t skip_at = src.find(skip);
    ASSERT_NE(skip_at, std::string::npos);
    src.replace(skip_at, skip.size(), "if (skip) { if (tid == 0) gf_tiles_left_out += 1; continue; }");
    const size_t kernel_at = src.find("extern \"C\" __global__");
    ASSERT_NE(kernel_at, std::string::npos);
    src.insert(kernel_at, "extern \"C\" { long long gf_tiles_left_out = 0; }\n");
    CudaKernelSource ck = *k;
    ck.name = counted, ck.source = src;
    auto host = HostKernel::Build(ck);
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    const std::vector<Tensor> ins = FlashInputs(**g, c, 400);
    std::vector<Tensor> operands;
    for (const Value* v : fa->inputs()) {
      const auto& gi = (*g)->inputs();
      operands.push_back(v->constant() ? ConvertedTo(*v->constant(), v->dtype())
                                       : ConvertedTo(ins[static_cast<size_t>(std::find(gi.begin(), gi.end(), v) - gi.begin())],
                                                     v->dtype()));
    }
    auto want = Execute(**g, Views(ins), CpuContext{});
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    std::vector<void*> args;
    for (Tensor& t : operands) args.push_back(t.data());
    Tensor got = Tensor::Empty(DType::kF32, (*want)[0].shape()).value();
    args.push_back(got.data());
    (*host)->Launch(args, k->sizes, 3);
    const std::filesystem::path so =
        std::filesystem::temp_directory_path() / "graphfuse_host_emulation" / (counted + "_h2.so");
    void* h = dlopen(so.c_str(), RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(h, nullptr) << so << ": " << dlerror();
    const auto* left_out = static_cast<const long long*>(dlsym(h, "gf_tiles_left_out"));
    ASSERT_NE(left_out, nullptr);
    EXPECT_EQ(*left_out, sk.tiles);
    dlclose(h);
    ExpectClose(got, (*want)[0], 1e-4, 1e-5, "output");
    std::printf("[ emulated ] %s: %lld key tiles left out\n", Label(c).c_str(), *left_out);
  }
}

// A constant causal mask in f16 / bf16 (a converted model's) leaves the same key tiles out.
TEST(FlashAttention, NarrowCausalMaskLeavesKeyTilesOutToo) {
  const FlashCase c{1, 4, 4, 130, 16, MaskKind::kCausal};
  for (DType dt : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(dt));
    auto g = ParseGraph(FlashGraphText(c));
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    auto narrow = ConvertPrecision(**g, dt, {.narrow_io = true});
    ASSERT_TRUE(narrow.ok()) << narrow.status().ToString();
    const Node* fa = OnlyAttention(**narrow);
    ASSERT_NE(fa, nullptr);
    EXPECT_EQ(fa->output()->dtype(), dt);
    auto k = GenerateFlashAttentionKernel(*fa);
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    EXPECT_NE(k->name.find("_bc64_causal_"), std::string::npos) << k->name;
    EXPECT_NE(k->name.find(DTypeName(dt)), std::string::npos) << k->name;
  }
}

// The plan: flash for many query rows per head (the kernel name says so, with its tiles),
// the GEMM form when asked for, the one-row form for few rows.
TEST(FlashAttention, PlanPicksTheFlashKernelForPrefill) {
  auto g = ParseGraph(FlashGraphText({1, 4, 2, 130, 16, MaskKind::kCausal}));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Node* fa = OnlyAttention(**g);
  auto flash = PlanNodeForCuda(*fa);
  ASSERT_TRUE(flash.ok()) << flash.status().ToString();
  EXPECT_EQ(flash->path, CudaPath::kKernel);
  ASSERT_EQ(flash->kernels.size(), 1u);
  EXPECT_EQ(flash->kernels[0].name.rfind("flash_attention_mask_h4_kv2_d16_br32_bc64_causal_f32_", 0), 0u)
      << flash->kernels[0].name;
  EXPECT_NE(flash->what.find("flash attention"), std::string::npos) << flash->what;
  CudaPlanOptions gemms;
  gemms.prefill_attention = PrefillAttention::kGemms;
  auto gemm = PlanNodeForCuda(*fa, gemms);
  ASSERT_TRUE(gemm.ok()) << gemm.status().ToString();
  EXPECT_EQ(gemm->path, CudaPath::kAttentionGemms);
  CudaPlanOptions rows;
  rows.attention_rows_one_kernel = 130;
  auto one = PlanNodeForCuda(*fa, rows);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->kernels[0].name.rfind("attention_", 0), 0u) << one->kernels[0].name;
  EXPECT_EQ(ParsePrefillAttention("gemms").value(), PrefillAttention::kGemms);
  EXPECT_EQ(ParsePrefillAttention("flash").value(), PrefillAttention::kFlash);
  EXPECT_FALSE(ParsePrefillAttention("cublas").ok());
  // A head too wide for the flash kernel's shared memory keeps the GEMM form.
  auto wide = ParseGraph(FlashGraphText({1, 1, 1, 20, 512, MaskKind::kNone}));
  ASSERT_TRUE(wide.ok()) << wide.status().ToString();
  auto wp = PlanNodeForCuda(*OnlyAttention(**wide));
  ASSERT_TRUE(wp.ok()) << wp.status().ToString();
  EXPECT_EQ(wp->path, CudaPath::kAttentionGemms);
}

// The exported blocks through the emulated CUDA executor with every attention planned as
// prefill (attention_rows_one_kernel 0): the flash kernel, against the CPU executor.
TEST(FlashAttention, ExportedBlocksThroughTheEmulatedExecutorMatchTheCpu) {
  const std::filesystem::path models = std::filesystem::path(GF_MODELS_DIR);
  for (const char* name : {"llama_block_opset17", "gpt2_block_opset17", "bert_layer_opset17", "gpt2_where_block_opset13"}) {
    SCOPED_TRACE(name);
    auto g = ImportOnnxFile((models / name / "model.onnx").string());
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    ASSERT_TRUE(RunPipeline(**g, cuda::DefaultCudaTarget()).ok());
    const std::vector<Tensor> ins = RandomInputs(**g, 23, 0.05, 1.0, [](const Value& v, int64_t, std::mt19937& rng) -> std::optional<double> {
      if (IsFloat(v.dtype())) return std::nullopt;
      return v.dtype() == DType::kBool ? double(rng() % 4 != 0) : 0.0;
    });
    const std::vector<TensorView> views = Views(ins);
    auto want = Execute(**g, views, CpuContext{});
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    CudaExecOptions o;
    o.emulate = true;
    o.plan.attention_rows_one_kernel = 0;
    auto ex = CudaExecutor::Create(**g, o);
    ASSERT_TRUE(ex.ok()) << ex.status().ToString();
    auto got = (*ex)->Run(views);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->size(), want->size());
    for (size_t k = 0; k < got->size(); ++k) ExpectClose((*got)[k], (*want)[k], 1e-4, 1e-5, StrCat("output ", k));
    std::string plan;
    for (const std::string& l : (*ex)->describe()) plan += l + "\n";
    EXPECT_NE(plan.find("flash attention"), std::string::npos) << plan;
    EXPECT_NE(plan.find("flash_attention_"), std::string::npos) << plan;
    EXPECT_EQ(plan.find("attention as GEMMs"), std::string::npos) << plan;
    EXPECT_EQ((*ex)->stats().host_fallbacks, 0);
    std::printf("[ emulated ] %s with flash attention:\n%s", name, plan.c_str());
  }
}

}  // namespace
}  // namespace graphfuse::cuda
