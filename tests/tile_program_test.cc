// The tile executor beyond single ops: dtype conversions at load/store, multi-instruction
// programs (what fusion will emit), and in-place safety.
#include "cpu/tile_program.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "graphfuse/thread_pool.h"
#include "ops/philox.h"
#include "test_util.h"

namespace graphfuse {
namespace {

// Cast between every pair of dtypes matches converting through double (saturating float->int,
// NaN -> 0, round-to-nearest-even into f16/bf16, nonzero -> true), except integer narrowing,
// which wraps as in C and numpy.
TEST(Cast, EveryDTypePair) {
  const std::vector<double> values = {0, -0.0, 1, -1, 2.5, -2.5, 3.75, 1e-3, 65504, 70000, -1e10, 1e10, 255, 300};
  for (DType from : kAllDTypes) {
    for (DType to : kAllDTypes) {
      Tensor x = Tensor::Empty(from, {static_cast<int64_t>(values.size())}).value();
      for (size_t i = 0; i < values.size(); ++i) x.SetFromDouble(i, values[i]);
      OpAttrs a;
      a.to = to;
      TensorView v = x.view();
      auto out = RunOp(OpKind::kCast, {&v, 1}, a, CpuContext{});
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      for (size_t i = 0; i < values.size(); ++i) {
        Tensor want = Tensor::Empty(to, {1}).value();
        want.SetFromDouble(0, x.GetAsDouble(i));
        if (from == DType::kI64 && to == DType::kI32)
          want.data_as<int32_t>()[0] = static_cast<int32_t>(x.data_as<int64_t>()[i]);
        EXPECT_EQ(out->GetAsDouble(i), want.GetAsDouble(0))
            << DTypeName(from) << " -> " << DTypeName(to) << " of " << x.GetAsDouble(i);
      }
    }
  }
}

// A three-instruction program u = (x + y) * s + b with a broadcast bias equals the three ops
// run one by one, bit for bit (same primitives, same order, no FMA contraction).
TEST(TileProgram, ChainEqualsUnfusedBitwise) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    const int64_t rows = 37, cols = 4096;
    std::mt19937 rng(5);
    Tensor x = Tensor::Empty(dt, {rows, cols}).value(), y = Tensor::Empty(dt, {rows, cols}).value();
    Tensor s = Tensor::Empty(dt, {}).value(), b = Tensor::Empty(dt, {cols}).value();
    for (Tensor* t : {&x, &y, &s, &b}) testing::FillRandom(*t, OpKind::kAdd, 0, rng);
    // Unfused, with f32 intermediates so that no rounding to dt happens in between.
    auto as_f32 = [](const Tensor& t) {
      OpAttrs a;
      a.to = DType::kF32;
      TensorView v = t.view();
      return RunOp(OpKind::kCast, {&v, 1}, a, CpuContext{}).value();
    };
    Tensor xf = as_f32(x), yf = as_f32(y), sf = as_f32(s), bf = as_f32(b);
    TensorView v1[] = {xf.view(), yf.view()};
    Tensor t1 = RunOp(OpKind::kAdd, v1, {}, CpuContext{}).value();
    TensorView v2[] = {t1.view(), sf.view()};
    Tensor t2 = RunOp(OpKind::kMul, v2, {}, CpuContext{}).value();
    TensorView v3[] = {t2.view(), bf.view()};
    Tensor t3 = RunOp(OpKind::kAdd, v3, {}, CpuContext{}).value();
    OpAttrs to;
    to.to = dt;
    TensorView v4 = t3.view();
    Tensor want = RunOp(OpKind::kCast, {&v4, 1}, to, CpuContext{}).value();

    Tensor got = Tensor::Empty(dt, {rows, cols}).value();
    cpu::TileProgram p;
    const Shape shape = {rows, cols};
    p.shape = cpu::TileShape(shape);
    p.inputs = {{dt, x.data(), cpu::TileStrides(x.shape(), shape), cpu::Domain::kF32},
                {dt, y.data(), cpu::TileStrides(y.shape(), shape), cpu::Domain::kF32},
                {dt, s.data(), cpu::TileStrides(s.shape(), shape), cpu::Domain::kF32},
                {dt, b.data(), cpu::TileStrides(b.shape(), shape), cpu::Domain::kF32}};
    p.instrs = {{OpKind::kAdd, {0, 1, 0}, {}, cpu::Domain::kF32},
                {OpKind::kMul, {4, 2, 0}, {}, cpu::Domain::kF32},
                {OpKind::kAdd, {5, 3, 0}, {}, cpu::Domain::kF32}};
    p.outputs = {{6, dt, got.data()}};
    ThreadPool pool(2);
    cpu::RunTileProgram(p, CpuContext{&pool, 2, 1024});
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.nbytes())) << DTypeName(dt);
  }
}

// out aliases input x, and x is still read after the first instruction: the executor must
// not write the first result into x's memory early.
TEST(TileProgram, InPlaceWithLaterReadStaysCorrect) {
  const int64_t n = 10000;
  Tensor x = Tensor::Empty(DType::kF32, {n}).value();
  std::vector<float> orig(n);
  for (int64_t i = 0; i < n; ++i) orig[i] = x.data_as<float>()[i] = 0.5f + static_cast<float>(i % 97);
  cpu::TileProgram p;
  p.shape = {n};
  p.inputs = {{DType::kF32, x.data(), {1}, cpu::Domain::kF32}};
  // %1 = x * x (an output, written into x), %2 = %1 + x (another output, elsewhere)
  Tensor second = Tensor::Empty(DType::kF32, {n}).value();
  p.instrs = {{OpKind::kMul, {0, 0, 0}, {}, cpu::Domain::kF32}, {OpKind::kAdd, {1, 0, 0}, {}, cpu::Domain::kF32}};
  p.outputs = {{1, DType::kF32, x.data()}, {2, DType::kF32, second.data()}};
  cpu::RunTileProgram(p, CpuContext{});
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(x.data_as<float>()[i], orig[i] * orig[i]);
    ASSERT_EQ(second.data_as<float>()[i], orig[i] * orig[i] + orig[i]) << i;
  }
}

// Launches writing more than 32 MiB of f32 store it non-temporally: straight from the
// instruction that computes it (%3 below), or from an L1 stage when a later instruction still
// reads it (%2). The same bits as the in-cache path, with a ragged tail, an output written over
// an input that is still read, and a one-instruction in-place launch (memory to memory).
TEST(TileProgram, LargeOutputsStoredNonTemporallyAreExact) {
  const int64_t n = (int64_t{8} << 20) + 37;  // 32 MiB + 148 bytes per output
  Tensor x = Tensor::Empty(DType::kF32, {n}).value(), y = Tensor::Empty(DType::kF32, {n}).value();
  std::vector<float> xs(n), ys(n);
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-4, 4);
  for (int64_t i = 0; i < n; ++i) xs[i] = x.data_as<float>()[i] = u(rng), ys[i] = y.data_as<float>()[i] = u(rng);
  Tensor second = Tensor::Empty(DType::kF32, {n}).value();
  cpu::TileProgram p;
  p.shape = {n};
  p.inputs = {{DType::kF32, x.data(), {1}, cpu::Domain::kF32}, {DType::kF32, y.data(), {1}, cpu::Domain::kF32}};
  // %2 = x * y (written into x), %3 = %2 + x (elsewhere)
  p.instrs = {{OpKind::kMul, {0, 1, 0}, {}, cpu::Domain::kF32}, {OpKind::kAdd, {2, 0, 0}, {}, cpu::Domain::kF32}};
  p.outputs = {{2, DType::kF32, x.data()}, {3, DType::kF32, second.data()}};
  ThreadPool pool(2);
  cpu::RunTileProgram(p, CpuContext{&pool});
  for (int64_t i = 0; i < n; ++i) {
    const float prod = xs[i] * ys[i];
    ASSERT_EQ(x.data_as<float>()[i], prod) << i;
    ASSERT_EQ(second.data_as<float>()[i], prod + xs[i]) << i;
  }
  // y = y + y in place, one instruction.
  cpu::TileProgram q;
  q.shape = {n};
  q.inputs = {{DType::kF32, y.data(), {1}, cpu::Domain::kF32}};
  q.instrs = {{OpKind::kAdd, {0, 0, 0}, {}, cpu::Domain::kF32}};
  q.outputs = {{1, DType::kF32, y.data()}};
  cpu::RunTileProgram(q, CpuContext{&pool});
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y.data_as<float>()[i], ys[i] + ys[i]) << i;
  // A result stored non-temporally in pieces (with the next tile's inputs prefetched between
  // them) keeps every element's own counter: Dropout(x * x) against the scalar rule.
  cpu::TileProgram d;
  d.shape = {n};
  d.inputs = {{DType::kF32, y.data(), {1}, cpu::Domain::kF32}};
  OpAttrs drop;
  drop.alpha = 0.3f, drop.training = true, drop.seed = 77;
  d.instrs = {{OpKind::kMul, {0, 0, 0}, {}, cpu::Domain::kF32}, {OpKind::kDropout, {1, 0, 0}, drop, cpu::Domain::kF32}};
  d.outputs = {{2, DType::kF32, second.data()}};
  cpu::RunTileProgram(d, CpuContext{&pool});
  for (int64_t i = 0; i < n; ++i) {
    const float sq = (ys[i] + ys[i]) * (ys[i] + ys[i]);
    const float want = DropoutKeep(drop.seed, static_cast<uint64_t>(i), drop.alpha) ? sq * DropoutScale(drop.alpha) : 0.f;
    ASSERT_EQ(second.data_as<float>()[i], want) << i;
  }
}

// RunOp runs f32 operands of the output's shape on one thread straight over the caller's
// arrays (RunContiguousF32), without planning a tile program: the same bits as the tile path,
// for every f32 op, out of place and in place (Dropout's counter starts at element 0 in both).
TEST(TileProgram, ContiguousFastPathMatchesTheTilePath) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-3, 3);
  for (const OpInfo& op : AllOps()) {
    if (op.cls == OpClass::kLogical || op.cls == OpClass::kSelect || op.cls == OpClass::kCompare) continue;  // not f32 -> f32
    if (op.kind == OpKind::kBias) continue;  // its [C] operand is never the output's shape
    OpAttrs a = DefaultAttrs(op.kind);
    if (op.kind == OpKind::kDropout) a.alpha = 0.25f, a.training = true, a.seed = 99;
    for (int64_t n : {64, 4096}) {
      std::vector<Tensor> in;
      std::vector<TensorView> views;
      for (int k = 0; k < op.arity; ++k) {
        in.push_back(Tensor::Empty(DType::kF32, {n / 64, 64}).value());
        for (int64_t i = 0; i < n; ++i) in.back().data_as<float>()[i] = u(rng);
      }
      for (const Tensor& t : in) views.push_back(t.view());
      Tensor fast = Tensor::Empty(DType::kF32, {n / 64, 64}).value(), tiled = Tensor::Empty(DType::kF32, {n / 64, 64}).value();
      ASSERT_TRUE(RunOp(op.kind, views, fast.view(), a, CpuContext{}).ok()) << op.name;
      cpu::RunTileProgram(cpu::SingleOpProgram(op.kind, views, tiled.view(), a), CpuContext{});
      ASSERT_EQ(std::memcmp(fast.data(), tiled.data(), tiled.nbytes()), 0) << op.name << " n=" << n;
      // In place: the first input is the output.
      ASSERT_TRUE(RunOp(op.kind, views, views[0], a, CpuContext{}).ok()) << op.name;
      ASSERT_EQ(std::memcmp(in[0].data(), tiled.data(), tiled.nbytes()), 0) << op.name << " in place, n=" << n;
    }
  }
}

}  // namespace
}  // namespace graphfuse
