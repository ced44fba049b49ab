// PackedGemm (src/cpu/kernels/packed_gemm.h): the own engine (the weight-streaming loop up to
// kStreamRows rows of A, tiles past them) and oneDNN's packed matmul, with f32 and bf16 weights
// and the post-ops (a bias row, then a residual add and a multiply), against a float64
// reference on random data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/kernels/packed_gemm.h"
#include "cpu/simd.h"
#include "graphfuse/dtype.h"

namespace graphfuse::kernels {
namespace {

using Storage = PackedGemm::WeightStorage;
using PostOp = PackedGemm::PostOp;

std::vector<float> Random(size_t n, std::mt19937& rng, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

struct Case {
  int64_t m, k, n;
  Storage storage;
  bool post_ops;
  GemmEngine engine = GemmEngine::kAuto;
  bool bf16_dot = true;
};

// C = ((A @ B) + bias) + R) * S, every block run; the float64 reference uses B as packed (rounded
// to bf16 for kBF16) and, where the GEMM reads it so (ReadsA16), A rounded to bf16 too. The error bound is f32's over a K-term dot: K * 2^-24 * sum |a b| (plus the
// post-ops' roundings).
void Check(const Case& c, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << c.m << "x" << c.n << "x" << c.k << (c.storage == Storage::kBF16 ? " bf16" : " f32")
                                    << (c.bf16_dot ? "" : " widened")
                                    << (c.post_ops ? " + bias, residual, scale" : "") << " engine "
                                    << static_cast<int>(c.engine));
  std::mt19937 rng(seed);
  const int64_t ldb = c.n + 3, ldc = c.n + 5;  // B and C wider than n: the leading dimensions count
  const std::vector<float> a = Random(static_cast<size_t>(c.m * c.k), rng);
  const std::vector<float> b = Random(static_cast<size_t>(c.k * ldb), rng);
  const std::vector<float> bias = Random(static_cast<size_t>(c.n), rng);
  const std::vector<float> r = Random(static_cast<size_t>(c.m * ldc), rng);
  const std::vector<float> s = Random(static_cast<size_t>(c.m * ldc), rng, 0.5f, 2.f);
  std::vector<PostOp> ops;
  std::vector<const float*> operands;
  if (c.post_ops) {
    ops = {{PostOp::Kind::kAdd, true}, {PostOp::Kind::kAdd, false}, {PostOp::Kind::kMul, false}};
    operands = {bias.data(), r.data(), s.data()};
  }
  auto g = PackedGemm::Create(c.m, c.k, c.n, b.data(), ldb, ldc, ops,
                              {.storage = c.storage, .engine = c.engine, .bf16_dot = c.bf16_dot});
  if (!g.ok() && c.engine == GemmEngine::kOneDnn && c.storage == Storage::kBF16 && simd::kLanes < 16) {
    // oneDNN 2.6 has no bf16 matmul below AVX-512: refused as such (kAuto then takes the own
    // loops, which the kAuto cases check).
    EXPECT_EQ(g.status().code(), StatusCode::kUnimplemented) << g.status().ToString();
    EXPECT_NE(g.status().message().find("oneDNN has no matmul for bf16 weights on this CPU"), std::string::npos)
        << g.status().ToString();
    return;
  }
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const GemmEngine engine = c.engine == GemmEngine::kAuto ? PackedGemm::AutoEngine(c.m, c.storage) : c.engine;
  EXPECT_EQ((*g)->engine(), engine);
  // bf16 weights meet A rounded to bf16 in oneDNN's bf16 matmul, and in the own loops where they
  // are dot products (AVX512-BF16, at every rows); else the own loops widen the weights.
  const bool bf16 = c.storage == Storage::kBF16;
  const bool dots = bf16 && engine == GemmEngine::kOwn && PackedGemm::OwnBf16Dot() && c.bf16_dot;
  EXPECT_EQ((*g)->streamed(), engine == GemmEngine::kOwn && c.m <= PackedGemm::kStreamRows && !dots);
  EXPECT_EQ((*g)->storage(), c.storage);
  EXPECT_EQ((*g)->ReadsA16(), dots || (bf16 && engine == GemmEngine::kOneDnn));
  std::vector<float> out(static_cast<size_t>(c.m * ldc), NAN);
  for (int64_t blk = 0; blk < (*g)->blocks(); ++blk) (*g)->RunBlock(blk, a.data(), out.data(), operands);
  double worst = 0;
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double dot = 0, mag = 0;
      const bool bf16_a = (*g)->ReadsA16();
      for (int64_t kk = 0; kk < c.k; ++kk) {
        float w = b[static_cast<size_t>(kk * ldb + j)], x = a[static_cast<size_t>(i * c.k + kk)];
        if (bf16) w = BF16BitsToF32(F32ToBF16Bits(w));
        if (bf16_a) x = BF16BitsToF32(F32ToBF16Bits(x));
        dot += double(x) * w;
        mag += std::fabs(double(x) * w);
      }
      double want = dot;
      const size_t at = static_cast<size_t>(i * ldc + j);
      if (c.post_ops) want = (want + bias[static_cast<size_t>(j)] + r[at]) * s[at];
      const double tol = (c.k * 0x1p-24 * mag + 4 * 0x1p-24 * (std::fabs(want) + 4)) * (c.post_ops ? 2 : 1);
      const double err = std::fabs(out[at] - want);
      worst = std::max(worst, err / tol);
      ASSERT_LE(err, tol) << "C[" << i << ", " << j << "] = " << out[at] << ", float64 " << want;
    }
  // Columns past n (within ldc) are not written.
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = c.n; j < ldc; ++j) ASSERT_TRUE(std::isnan(out[static_cast<size_t>(i * ldc + j)])) << i << ", " << j;
}

TEST(PackedGemm, EveryEngineMatchesFloat64) {
  uint32_t seed = 1;
  for (Storage st : {Storage::kF32, Storage::kBF16})
    for (bool post : {false, true}) {
      // The engine kAuto takes: f32 rows 1..8 stream (widths not a multiple of a panel, several
      // blocks), the own tiles up to 63 rows and oneDNN from 64; bf16 the own dot products
      // (AVX512-BF16: one row's stream, then the tiles) or the stream up to 8 rows, past them the
      // dot products or oneDNN
      // (AutoEngine). bf16 runs once more with the weights widened as a CPU without bf16 dot
      // products does: the stream, then the tiles.
      for (bool dots : {true, false}) {
        if (!dots && st != Storage::kBF16) continue;
        for (int64_t m : {1, 2, 5, 8, 9, 33, 64})
          Check({m, 67, 1000, st, post, GemmEngine::kAuto, dots}, seed++);
        Check({1, 4096, 70, st, post, GemmEngine::kAuto, dots}, seed++);
        Check({3, 5, 17, st, post, GemmEngine::kAuto, dots}, seed++);
        Check({1, 5, 17, st, post, GemmEngine::kAuto, dots}, seed++);  // one panel, an odd K
        Check({21, 600, 300, st, post, GemmEngine::kOwn, dots}, seed++);
      }
      // Each engine forced, past the stream: the tiles' row groups end short (9 = 8 + 1, 21 =
      // 8 + 8 + 5), the rows run in two blocks (70 = 64 + 6) and K over several chunks, the last
      // one short (600 = 256 + 256 + 88).
      for (GemmEngine e : {GemmEngine::kOwn, GemmEngine::kOneDnn})
        for (int64_t m : {9, 21, 70}) Check({m, 600, 300, st, post, e}, seed++);
      // An odd K, the last chunk's last pair of K rows half filled (601 = 256 + 256 + 89).
      for (GemmEngine e : {GemmEngine::kOwn, GemmEngine::kOneDnn}) Check({21, 601, 100, st, post, e}, seed++);
    }
}

// With an odd K the own dot-product tiles read A in pairs except the last value of each row: an
// infinity first in the next row stays out of the row before it (it would make that row NaN if
// the last pair read it, even against the zero the weights are padded with).
TEST(PackedGemm, OddKLeavesTheNextRowOut) {
  std::mt19937 rng(9);
  const int64_t m = 12, k = 33, n = 64;
  std::vector<float> a = Random(static_cast<size_t>(m * k), rng);
  const std::vector<float> b = Random(static_cast<size_t>(k * n), rng);
  for (int64_t i = 1; i < m; i += 2) a[static_cast<size_t>(i * k)] = INFINITY;
  for (Storage st : {Storage::kF32, Storage::kBF16}) {
    auto g = PackedGemm::Create(m, k, n, b.data(), n, n, {}, {.storage = st, .engine = GemmEngine::kOwn});
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    std::vector<float> c(static_cast<size_t>(m * n));
    for (int64_t blk = 0; blk < (*g)->blocks(); ++blk) (*g)->RunBlock(blk, a.data(), c.data());
    for (int64_t i = 0; i < m; i += 2)
      for (int64_t j = 0; j < n; ++j) ASSERT_TRUE(std::isfinite(c[static_cast<size_t>(i * n + j)])) << i << ", " << j;
  }
}

// kAuto's choice by rows and storage (bench/bench_gemm measures it), with a reason for each.
TEST(PackedGemm, AutoEngineFollowsTheRowsAndTheStorage) {
  const char* why = nullptr;
  EXPECT_EQ(PackedGemm::AutoEngine(1, Storage::kF32, &why), GemmEngine::kOwn);
  EXPECT_NE(std::string(why).find("stream"), std::string::npos) << why;
  EXPECT_EQ(PackedGemm::AutoEngine(8, Storage::kBF16), GemmEngine::kOwn);
  // bf16 past the stream: oneDNN with AMX, the own dot-product tiles with AVX512-BF16.
  for (int64_t m : {9, 64, 512}) {
    const GemmEngine e = PackedGemm::AutoEngine(m, Storage::kBF16, &why);
    EXPECT_NE(std::string(why).find("bf16"), std::string::npos) << why;
    if (CpuHasAmxBf16()) {
      EXPECT_EQ(e, GemmEngine::kOneDnn) << m;
    } else if (PackedGemm::OwnBf16Dot()) {
      EXPECT_EQ(e, GemmEngine::kOwn) << m;
    }
  }
  EXPECT_EQ(PackedGemm::AutoEngine(32, Storage::kF32, &why), GemmEngine::kOwn);
  EXPECT_NE(std::string(why).find("tiles"), std::string::npos) << why;
  EXPECT_EQ(PackedGemm::AutoEngine(kOneDnnRowsF32 - 1, Storage::kF32), GemmEngine::kOwn);
  EXPECT_EQ(PackedGemm::AutoEngine(kOneDnnRowsF32, Storage::kF32, &why), GemmEngine::kOneDnn);
  EXPECT_NE(std::string(why).find("oneDNN"), std::string::npos) << why;
  // One packed form for every row count (a model whose plans serve many shapes): f32 stays on
  // the own panels at any rows; bf16 keeps its choice.
  for (int64_t m : {int64_t{1}, int64_t{32}, kOneDnnRowsF32, int64_t{512}}) {
    EXPECT_EQ(PackedGemm::AutoEngine(m, Storage::kF32, &why, /*one_form=*/true), GemmEngine::kOwn) << m;
    EXPECT_EQ(PackedGemm::AutoEngine(m, Storage::kBF16, nullptr, true), PackedGemm::AutoEngine(m, Storage::kBF16)) << m;
  }
  EXPECT_NE(std::string(why).find("every"), std::string::npos) << why;
}

// A row operand after another post-op: the own loops take it (C = (A @ B) * S + bias), oneDNN's
// form only as the first post-op, so oneDNN forced refuses it and kAuto takes the own tiles
// where it would have taken oneDNN (70 rows).
TEST(PackedGemm, OwnLoopsTakeARowOperandAnywhere) {
  std::mt19937 rng(5);
  const int64_t k = 40, n = 100;
  const std::vector<float> b = Random(static_cast<size_t>(k * n), rng), bias = Random(static_cast<size_t>(n), rng);
  const std::vector<PostOp> ops = {{PostOp::Kind::kMul, false}, {PostOp::Kind::kAdd, true}};
  for (int64_t m : {int64_t{3}, int64_t{20}, int64_t{70}}) {
    const std::vector<float> a = Random(static_cast<size_t>(m * k), rng), sc = Random(static_cast<size_t>(m * n), rng);
    auto refused = PackedGemm::Create(m, k, n, b.data(), n, n, ops, {.engine = GemmEngine::kOneDnn});
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kUnimplemented);
    auto g = PackedGemm::Create(m, k, n, b.data(), n, n, ops);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ((*g)->engine(), GemmEngine::kOwn);
    std::vector<float> c(static_cast<size_t>(m * n));
    const std::vector<const float*> operands = {sc.data(), bias.data()};
    for (int64_t blk = 0; blk < (*g)->blocks(); ++blk) (*g)->RunBlock(blk, a.data(), c.data(), operands);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0, mag = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          dot += double(a[static_cast<size_t>(i * k + kk)]) * b[static_cast<size_t>(kk * n + j)];
          mag += std::fabs(double(a[static_cast<size_t>(i * k + kk)]) * b[static_cast<size_t>(kk * n + j)]);
        }
        const double want = dot * sc[static_cast<size_t>(i * n + j)] + bias[static_cast<size_t>(j)];
        EXPECT_NEAR(c[static_cast<size_t>(i * n + j)], want, k * 0x1p-23 * mag + 0x1p-21 * (std::fabs(want) + 2));
      }
  }
}

// bf16 weights change the result by the weights' rounding only: against the f32 form on the
// same data, within K * 2^-9 * sum |a b|, and not equal to it.
TEST(PackedGemm, Bf16WeightsDifferFromF32ByTheirRounding) {
  std::mt19937 rng(9);
  const int64_t m = 1, k = 512, n = 256;
  const std::vector<float> a = Random(static_cast<size_t>(m * k), rng), b = Random(static_cast<size_t>(k * n), rng);
  std::vector<float> c32(static_cast<size_t>(m * n)), c16(static_cast<size_t>(m * n));
  for (auto [st, out] : {std::pair{Storage::kF32, &c32}, {Storage::kBF16, &c16}}) {
    auto g = PackedGemm::Create(m, k, n, b.data(), n, n, {}, {.storage = st});
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    for (int64_t blk = 0; blk < (*g)->blocks(); ++blk) (*g)->RunBlock(blk, a.data(), out->data());
  }
  int64_t differ = 0;
  for (int64_t j = 0; j < n; ++j) {
    double mag = 0;
    for (int64_t kk = 0; kk < k; ++kk) mag += std::fabs(double(a[static_cast<size_t>(kk)]) * b[static_cast<size_t>(kk * n + j)]);
    EXPECT_LE(std::fabs(c16[static_cast<size_t>(j)] - c32[static_cast<size_t>(j)]), 0x1p-9 * mag) << j;
    differ += c16[static_cast<size_t>(j)] != c32[static_cast<size_t>(j)];
  }
  EXPECT_GT(differ, n / 2);
}

}  // namespace
}  // namespace graphfuse::kernels

namespace graphfuse::kernels {
namespace {

// A converted once by the caller (ToBF16) gives the bits the matmul gets converting it per block;
// ToBF16 rounds to nearest even as F32ToBF16Bits does, NaN included.
TEST(PackedGemm, Bf16AConvertedOnceMatchesPerBlock) {
  std::mt19937 rng(12);
  const int64_t m = 20, k = 70, n = 300;
  std::vector<float> a = Random(static_cast<size_t>(m * k), rng), b = Random(static_cast<size_t>(k * n), rng);
  auto g = PackedGemm::Create(m, k, n, b.data(), n, n, {}, {.storage = Storage::kBF16});
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  std::vector<uint16_t> a16;
  const uint16_t* converted = (*g)->ConvertA(a.data(), a16);
  if (!(*g)->ReadsA16()) {
    // No engine here reads A in bf16 (no AVX512-BF16 dot products, no oneDNN bf16 matmul below
    // AVX-512): the own tiles widen the weights and read A as it is.
    EXPECT_EQ(converted, nullptr);
    GTEST_SKIP() << "this CPU has no engine that reads A in bf16";
  }
  ASSERT_NE(converted, nullptr);
  ASSERT_EQ(a16.size(), static_cast<size_t>(m * k));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a16[i], F32ToBF16Bits(a[i])) << i;
  std::vector<uint16_t> unused;
  auto f32 = PackedGemm::Create(m, k, n, b.data(), n, n);
  ASSERT_TRUE(f32.ok());
  EXPECT_EQ((*f32)->ConvertA(a.data(), unused), nullptr) << "f32 weights read A as it is";
  std::vector<float> per_block(static_cast<size_t>(m * n)), once(static_cast<size_t>(m * n));
  for (int64_t blk = 0; blk < (*g)->blocks(); ++blk) {
    (*g)->RunBlock(blk, a.data(), per_block.data());
    (*g)->RunBlock(blk, a.data(), once.data(), {}, converted);
  }
  EXPECT_EQ(per_block, once);
  const float special[] = {NAN, -NAN, INFINITY, -0.f, 1.00390625f, 1.01171875f, 3.4e38f};
  std::vector<float> s(special, special + 7);
  for (int i = 0; i < 20; ++i) s.push_back(Random(1, rng)[0]);  // past one vector: the loop and the tail
  std::vector<uint16_t> s16(s.size());
  PackedGemm::ToBF16(s.data(), static_cast<int64_t>(s.size()), s16.data());
  for (size_t i = 0; i < s.size(); ++i) {
    if (std::isnan(s[i])) EXPECT_TRUE(std::isnan(BF16BitsToF32(s16[i]))) << i;
    else EXPECT_EQ(s16[i], F32ToBF16Bits(s[i])) << i << ": " << s[i];
  }
}

// Through a store, the second packing of the same weights in the same layout is the first one's:
// B is gathered once (lazy_b), and both GEMMs compute the same bits, on every engine.
TEST(PackedGemm, AStoreSharesOnePackingOfTheWeights) {
  std::mt19937 rng(5);
  const int64_t k = 48, n = 96;
  const std::vector<float> a = Random(static_cast<size_t>(70 * k), rng);
  auto w = std::make_shared<Tensor>(Tensor::Empty(DType::kF32, {k, n}).value());
  const std::vector<float> values = Random(static_cast<size_t>(k * n), rng);
  std::copy(values.begin(), values.end(), w->data_as<float>());
  for (GemmEngine engine : {GemmEngine::kOwn, GemmEngine::kOneDnn}) {
    PreparedStore store;
    store.AddRoot(w);
    int gathered = 0;
    PackedGemmOptions o = PackOptionsFor(PrepareOptions{.store = &store}, *w, "all");
    o.engine = engine;
    o.lazy_b = [&]() {
      ++gathered;
      return w->data_as<float>();
    };
    ASSERT_EQ(o.store, &store);
    std::vector<std::vector<float>> outs;
    for (int64_t m : {70, 65}) {  // two plans' rows, one layout
      auto g = PackedGemm::Create(m, k, n, nullptr, n, n, {}, o);
      ASSERT_TRUE(g.ok()) << g.status().ToString();
      std::vector<float> c(static_cast<size_t>(m * n));
      for (int64_t blk = 0; blk < (*g)->blocks(); ++blk) (*g)->RunBlock(blk, a.data(), c.data());
      outs.push_back(std::vector<float>(c.begin(), c.begin() + 65 * n));
    }
    EXPECT_EQ(gathered, 1) << "engine " << static_cast<int>(engine);
    EXPECT_EQ(store.stats().entries, 1);
    EXPECT_EQ(outs[0], outs[1]);
  }
}

}  // namespace
}  // namespace graphfuse::kernels
