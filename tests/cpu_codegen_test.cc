// The CPU code generator: every program it compiles gives the tile executor's bits, over
// every op, every way an input can be read, ragged tails, threads, non-temporal stores and
// in-place outputs; programs outside its scope and failed compiles fall back to the tile
// executor; compiled kernels are found again in the disk cache.
#include "cpu/cpu_codegen.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <vector>

#include "graphfuse/cpu_codegen.h"
#include "graphfuse/thread_pool.h"
#include "test_util.h"

namespace graphfuse {
namespace {

// One cache directory per test process, empty at the start (the compile path runs) and
// removed at exit.
const std::string& CacheDir() {
  struct Dir {
    std::string path = (std::filesystem::temp_directory_path() / StrCat("graphfuse_codegen_test_", getpid())).string();
    Dir() { std::filesystem::remove_all(path); }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

CpuCodegen& Codegen() {
  static std::unique_ptr<CpuCodegen> cg = [] {
    auto r = CpuCodegen::Create({.cache_dir = CacheDir()});
    GF_CHECK(r.ok(), r.status().ToString());
    return std::move(*r);
  }();
  return *cg;
}

Tensor Random(DType dt, const Shape& s, std::mt19937& rng, OpKind op = OpKind::kAdd) {
  Tensor t = Tensor::Empty(dt, s).value();
  testing::FillRandom(t, op, 0, rng);
  return t;
}

// Runs `p` (its outputs bound to fresh buffers, or to the given ones) on the tile executor and
// with the code generator, and expects the same bytes. Returns whether the generator took it.
bool ExpectSameBits(cpu::TileProgram p, const CpuContext& base, const std::string& what) {
  const int64_t numel = [&] {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    return n;
  }();
  std::vector<std::vector<float>> tile(p.outputs.size()), native(p.outputs.size());
  cpu::TileProgram q = p;
  for (size_t o = 0; o < p.outputs.size(); ++o) {
    tile[o].assign(static_cast<size_t>(numel), -7.f);
    native[o].assign(static_cast<size_t>(numel), -9.f);
    p.outputs[o].data = tile[o].data();
    q.outputs[o].data = native[o].data();
  }
  cpu::RunTileProgram(p, base);
  CpuContext ctx = base;
  ctx.codegen = &Codegen();
  const cpu::TileRunner runner(q, ctx.codegen);
  runner.Launch(ctx);
  for (size_t o = 0; o < p.outputs.size(); ++o)
    EXPECT_EQ(0, std::memcmp(tile[o].data(), native[o].data(), static_cast<size_t>(numel) * 4))
        << what << ": output " << o << " differs";
  return runner.native();
}

cpu::TileInput In(const Tensor& t, const Shape& space) {
  return {t.dtype(), t.data(), cpu::TileStrides(t.shape(), space), cpu::Domain::kF32};
}

// out = ops[n-1](...ops[0](x)) over a 1-D x.
cpu::TileProgram UnaryChain(const Tensor& x, float* out, std::initializer_list<OpKind> ops) {
  cpu::TileProgram p;
  p.shape = cpu::TileShape(x.shape());
  p.inputs = {In(x, x.shape())};
  for (OpKind op : ops) {
    const int arg = static_cast<int>(p.instrs.size());
    p.instrs.push_back({op, {arg, 0, 0}, {}, cpu::Domain::kF32});
  }
  p.outputs = {{static_cast<int>(ops.size()), DType::kF32, out}};
  return p;
}

// u = (x + y) * s + b[C] over many shapes, and the same kernel each time (one compile).
TEST(CpuCodegen, ChainGivesTheTileExecutorsBits) {
  std::mt19937 rng(1);
  ThreadPool pool(2);
  const CpuCodegen::Stats before = Codegen().stats();
  struct Case {
    Shape shape;
    CpuContext ctx;
  };
  // Rows of whole vectors and ragged ones (a 1-D tail, rows of 100 and 33), one and two threads,
  // and 64 MiB outputs (stored non-temporally).
  const Case cases[] = {{{4096}, {}},         {{4096 + 5}, {}},  {{37, 4096}, {&pool, 2, 1024}},
                        {{3, 32}, {}},        {{5, 100}, {}},    {{370, 33}, {&pool, 2, 1024}},
                        {{1000003}, {&pool, 2, 1024}},           {{1024, 16384}, {&pool, 2, 1024}}};
  for (const Case& c : cases) {
    const Shape bias_shape = {c.shape.back()};
    Tensor x = Random(DType::kF32, c.shape, rng), y = Random(DType::kF32, c.shape, rng);
    Tensor s = Random(DType::kF32, {}, rng), b = Random(DType::kF32, bias_shape, rng);
    cpu::TileProgram p;
    p.shape = cpu::TileShape(c.shape);
    p.inputs = {In(x, c.shape), In(y, c.shape), In(s, c.shape), In(b, c.shape)};
    p.instrs = {{OpKind::kAdd, {0, 1, 0}, {}, cpu::Domain::kF32},
                {OpKind::kMul, {4, 2, 0}, {}, cpu::Domain::kF32},
                {OpKind::kAdd, {5, 3, 0}, {}, cpu::Domain::kF32}};
    p.outputs = {{6, DType::kF32, nullptr}};
    EXPECT_TRUE(ExpectSameBits(p, c.ctx, ShapeToString(c.shape))) << ShapeToString(c.shape);
  }
  const CpuCodegen::Stats after = Codegen().stats();
  EXPECT_EQ(after.compiled + after.loaded - before.compiled - before.loaded, 1) << "one kernel for every shape";
  EXPECT_EQ(after.failed, 0) << after.last_error;
}

// Every f32 op of the table, eight to a kernel, each reading the inputs x, y, z (Where reads
// x as its condition), with non-default attributes where the op has them (Dropout in
// training, Cast rounding to f16 and bf16).
TEST(CpuCodegen, EveryOpGivesTheTileExecutorsBits) {
  std::mt19937 rng(2);
  const Shape shape = {5, 512};
  Tensor x = Random(DType::kF32, shape, rng), y = Random(DType::kF32, shape, rng), z = Random(DType::kF32, shape, rng);
  std::vector<std::pair<OpKind, OpAttrs>> ops;
  for (const OpInfo& info : AllOps()) {
    const OpKind op = info.kind;
    OpAttrs a = DefaultAttrs(op);
    if (op == OpKind::kDropout) a.training = true, a.seed = 99, a.alpha = 0.3f;
    if (op == OpKind::kCast) {
      a.to = DType::kBF16;
      ops.push_back({op, a});
      a.to = DType::kF16;
    }
    ops.push_back({op, a});
  }
  for (size_t first = 0; first < ops.size(); first += cpu::kMaxTileOutputs) {
    cpu::TileProgram p;
    p.shape = cpu::TileShape(shape);
    p.inputs = {In(x, shape), In(y, shape), In(z, shape)};
    std::string names;
    for (size_t i = first; i < std::min(ops.size(), first + cpu::kMaxTileOutputs); ++i) {
      p.instrs.push_back({ops[i].first, {0, 1, 2}, ops[i].second, cpu::Domain::kF32});
      p.outputs.push_back({static_cast<int>(2 + p.instrs.size()), DType::kF32, nullptr});
      names += StrCat(" ", OpName(ops[i].first));
    }
    EXPECT_TRUE(ExpectSameBits(p, CpuContext{}, names)) << names;
  }
  EXPECT_EQ(Codegen().stats().failed, 0) << Codegen().stats().last_error;
}

// The other ways of reading an input: a per-row value ([R, 1]), rows further apart than the
// space's (a GEMM projection in a wider workspace), an output that is also an input register.
TEST(CpuCodegen, PerRowAndStridedInputs) {
  std::mt19937 rng(3);
  const int64_t rows = 9, cols = 100, ld = 3 * cols;  // rows end in a partial vector
  const Shape shape = {rows, cols};
  Tensor ws = Random(DType::kF32, {rows, ld}, rng), c = Random(DType::kF32, {rows, 1}, rng);
  cpu::TileProgram p;
  p.shape = cpu::TileShape(shape);
  cpu::TileDims strided;
  strided.push_back(ld);
  strided.push_back(1);
  p.inputs = {{DType::kF32, ws.data_as<float>() + cols, strided, cpu::Domain::kF32}, In(c, shape)};
  p.instrs = {{OpKind::kSilu, {0, 0, 0}, {}, cpu::Domain::kF32}, {OpKind::kMul, {2, 1, 0}, {}, cpu::Domain::kF32}};
  p.outputs = {{3, DType::kF32, nullptr}, {0, DType::kF32, nullptr}};
  EXPECT_TRUE(ExpectSameBits(p, CpuContext{}, "silu(ws[:, C:2C]) * c[R, 1]"));
}

// f16 and bf16 storage: loads widen, stores round to nearest even, as the tile executor's do,
// over special values too (NaN, infinities, signed zeros, subnormals, values that overflow
// f16, halfway cases), for outputs in place and beside f32 ones.
TEST(CpuCodegen, HalfPrecisionStorageGivesTheTileExecutorsBits) {
  std::mt19937 rng(9);
  const std::vector<double> special = {NAN, -NAN, INFINITY, -INFINITY, 0.0, -0.0, 1e-6, -6e-8, 3e-41, 65504, 65520,
                                       70000, -1e30, 1.0009765625, 1.00048828125, 0.1, 3.0517578125e-05};
  for (const auto& [dt, shape] : {std::pair<DType, Shape>{DType::kF16, {4, 1024}}, {DType::kBF16, {4, 1024}},
                                  {DType::kF16, {3, 1001}}, {DType::kBF16, {3, 1001}}}) {
    const int64_t numel = shape[0] * shape[1];
    Tensor x = Random(dt, shape, rng), b = Random(DType::kF32, {shape.back()}, rng), s = Random(dt, {}, rng);
    for (size_t i = 0; i < special.size(); ++i) x.SetFromDouble(static_cast<int64_t>(i * 37), special[i]);
    // Signaling NaNs, which no arithmetic produces: stored back, they come out quiet.
    x.data_as<uint16_t>()[1001] = dt == DType::kBF16 ? 0x7F81 : 0x7C01;
    x.data_as<uint16_t>()[2002] = dt == DType::kBF16 ? 0xFF81 : 0xFC01;
    for (size_t i = 0; i < special.size(); ++i) b.SetFromDouble(static_cast<int64_t>(i * 5 + 1), special[i] * 0.5);
    cpu::TileProgram p;
    p.shape = cpu::TileShape(shape);
    p.inputs = {In(x, shape), In(b, shape), In(s, shape)};
    OpAttrs round;
    round.to = dt;
    p.instrs = {{OpKind::kMul, {0, 2, 0}, {}, cpu::Domain::kF32},
                {OpKind::kCast, {3, 0, 0}, round, cpu::Domain::kF32},
                {OpKind::kAdd, {4, 1, 0}, {}, cpu::Domain::kF32},
                {OpKind::kSilu, {5, 0, 0}, {}, cpu::Domain::kF32}};
    // A half-precision output, an f32 output, and a half-precision copy of the input register.
    p.outputs = {{6, dt, nullptr}, {5, DType::kF32, nullptr}, {0, dt, nullptr}};
    std::vector<std::vector<uint8_t>> tile, native;
    cpu::TileProgram q = p;
    for (size_t o = 0; o < p.outputs.size(); ++o) {
      const size_t bytes = static_cast<size_t>(numel) * DTypeSize(p.outputs[o].dtype);
      tile.emplace_back(bytes, 0x11);
      native.emplace_back(bytes, 0x22);
      p.outputs[o].data = tile.back().data();
      q.outputs[o].data = native.back().data();
    }
    cpu::RunTileProgram(p, CpuContext{});
    const cpu::TileRunner r(q, &Codegen());
    EXPECT_TRUE(r.native()) << DTypeName(dt);
    r.Launch(CpuContext{});
    for (size_t o = 0; o < p.outputs.size(); ++o)
      EXPECT_EQ(tile[o], native[o]) << DTypeName(dt) << " output " << o;
    // In place: the half-precision input overwritten by the program's result.
    std::vector<uint8_t> a(static_cast<const uint8_t*>(x.data()), static_cast<const uint8_t*>(x.data()) + x.nbytes());
    std::vector<uint8_t> c = a;
    cpu::TileProgram pa = p, pc = p;
    pa.inputs[0].data = a.data(), pc.inputs[0].data = c.data();
    pa.outputs = {{6, dt, a.data()}};
    pc.outputs = {{6, dt, c.data()}};
    cpu::RunTileProgram(pa, CpuContext{});
    const cpu::TileRunner rc(pc, &Codegen());
    EXPECT_TRUE(rc.native()) << DTypeName(dt) << " in place";
    rc.Launch(CpuContext{});
    EXPECT_EQ(a, c) << DTypeName(dt) << " in place";
  }
}

// An output written over its own input (the same buffer, element for element) is in scope;
// one shifted against an input is not, and runs on the tile executor. Both stay exact.
TEST(CpuCodegen, InPlaceOutputs) {
  std::mt19937 rng(4);
  const int64_t n = 4096;
  Tensor x = Random(DType::kF32, {n + 16}, rng), y = Random(DType::kF32, {n}, rng);
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = (x.data_as<float>()[i] + y.data_as<float>()[i]) * y.data_as<float>()[i];
  auto program = [&](float* out, const float* xin) {
    cpu::TileProgram p;
    p.shape = cpu::TileShape({n});
    p.inputs = {{DType::kF32, xin, cpu::TileStrides({n}, {n}), cpu::Domain::kF32}, In(y, {n})};
    p.instrs = {{OpKind::kAdd, {0, 1, 0}, {}, cpu::Domain::kF32}, {OpKind::kMul, {2, 1, 0}, {}, cpu::Domain::kF32}};
    p.outputs = {{3, DType::kF32, out}};
    return p;
  };
  CpuContext ctx;
  ctx.codegen = &Codegen();
  {
    std::vector<float> a(x.data_as<float>(), x.data_as<float>() + n + 16);
    float* buf = a.data();
    const cpu::TileRunner r(program(buf, buf), ctx.codegen);
    EXPECT_TRUE(r.native());
    r.Launch(ctx);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(buf[i], want[i]) << i;
  }
  {
    // out = x shifted by 16 elements: element i is written before element i + 16 is read.
    std::vector<float> a(x.data_as<float>(), x.data_as<float>() + n + 16);
    float* buf = a.data();
    const int before = Codegen().stats().outside_scope;
    const cpu::TileRunner r(program(buf, buf + 16), ctx.codegen);
    EXPECT_FALSE(r.native());
    EXPECT_EQ(Codegen().stats().outside_scope, before + 1);
    EXPECT_EQ(Codegen().stats().outside_why["an output overlapping an input"], 1);
    std::vector<float> shifted(n);
    for (int64_t i = 0; i < n; ++i)
      shifted[i] = (x.data_as<float>()[i + 16] + y.data_as<float>()[i]) * y.data_as<float>()[i];
    r.Launch(ctx);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(buf[i], shifted[i]) << i;
  }
}

// Outside the scope: integer data read into f32 lanes; a space that stays three-dimensional
// ([4, 8, 32] with a [4, 1, 32] operand). Counted with their reasons, and run by the tile
// executor.
TEST(CpuCodegen, ProgramsOutsideTheScopeRunOnTiles) {
  std::mt19937 rng(5);
  const Shape flat = {4096}, cube = {4, 8, 32};
  struct Case {
    DType dt;
    Shape shape, b_shape;
    std::string why;
  };
  for (const Case& c : {Case{DType::kI32, flat, {4096}, "integer or bool data"},
                        Case{DType::kF32, cube, {4, 1, 32}, "more than two dims after merging"}}) {
    Tensor x = Random(c.dt, c.shape, rng), b = Random(c.dt, c.b_shape, rng);
    cpu::TileProgram p;
    p.shape = cpu::TileShape(c.shape);
    p.inputs = {In(x, c.shape), In(b, c.shape)};
    p.instrs = {{OpKind::kAdd, {0, 1, 0}, {}, cpu::Domain::kF32}, {OpKind::kGelu, {2, 0, 0}, {}, cpu::Domain::kF32}};
    p.outputs = {{3, DType::kF32, nullptr}};
    const CpuCodegen::Stats before = Codegen().stats();
    EXPECT_FALSE(ExpectSameBits(p, CpuContext{}, ShapeToString(c.shape)));
    EXPECT_EQ(Codegen().stats().outside_scope, before.outside_scope + 1);
    EXPECT_EQ(Codegen().stats().outside_why[c.why], (before.outside_why.count(c.why) ? before.outside_why.at(c.why) : 0) + 1);
  }
}

// A compiler that fails: the error is kept (with the compiler's log), the program runs on the
// tile executor, and the result is right.
TEST(CpuCodegen, FailedCompileFallsBackToTiles) {
  auto cg = CpuCodegen::Create({.cache_dir = CacheDir() + "/broken", .compiler = "c++ -include /nonexistent/gf_missing.h"});
  ASSERT_TRUE(cg.ok()) << cg.status().ToString();
  std::mt19937 rng(6);
  Tensor x = Random(DType::kF32, {4096}, rng);
  std::vector<float> out(4096);
  const cpu::TileRunner r(UnaryChain(x, out.data(), {OpKind::kAbs}), cg->get());
  EXPECT_FALSE(r.native());
  r.Launch(CpuContext{});
  for (int64_t i = 0; i < 4096; ++i) ASSERT_EQ(out[i], std::fabs(x.data_as<float>()[i]));
  EXPECT_EQ((*cg)->stats().failed, 1);
  EXPECT_NE((*cg)->stats().last_error.find("gf_missing.h"), std::string::npos) << (*cg)->stats().last_error;
  // The same program again (a GEMM epilogue builds its runner on every launch): not compiled
  // again, still on tiles.
  for (int again = 0; again < 3; ++again) {
    const cpu::TileRunner r2(UnaryChain(x, out.data(), {OpKind::kAbs}), cg->get());
    EXPECT_FALSE(r2.native());
  }
  EXPECT_EQ((*cg)->stats().failed, 1) << "a failed program was compiled again";
}

// A compiler that does not run is reported when the generator is created.
TEST(CpuCodegen, MissingCompilerIsReported) {
  auto cg = CpuCodegen::Create({.cache_dir = CacheDir(), .compiler = "/nonexistent/gf-cxx"});
  ASSERT_FALSE(cg.ok());
  EXPECT_NE(cg.status().message().find("/nonexistent/gf-cxx"), std::string::npos) << cg.status().ToString();
}

// A second generator over the same cache directory loads what the first compiled.
TEST(CpuCodegen, KernelsComeBackFromTheDiskCache) {
  std::mt19937 rng(7);
  Tensor x = Random(DType::kF32, {2048}, rng);
  std::vector<float> out(2048);
  const cpu::TileProgram p = UnaryChain(x, out.data(), {OpKind::kNeg, OpKind::kExp});
  for (int round = 0; round < 2; ++round) {
    auto cg = CpuCodegen::Create({.cache_dir = CacheDir() + "/shared"});
    ASSERT_TRUE(cg.ok()) << cg.status().ToString();
    const cpu::TileRunner r(p, cg->get());
    EXPECT_TRUE(r.native());
    EXPECT_EQ((*cg)->stats().compiled, round == 0 ? 1 : 0);
    EXPECT_EQ((*cg)->stats().loaded, round == 0 ? 0 : 1);
  }
}

// The disk cache is bounded: over cache_limit_bytes, the least recently used kernels go (down
// to three quarters of the bound); other files stay; a kernel found in the cache counts as used.
TEST(CpuCodegen, DiskCacheKeepsTheMostRecentlyUsedWithinItsBound) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(CacheDir()) / "bounded";
  fs::create_directories(dir);
  const auto now = fs::file_time_type::clock::now();
  for (int i = 0; i < 10; ++i) {  // 10 kernels of 1000 bytes, gf_cpu_k0 the oldest
    const fs::path f = dir / StrCat("gf_cpu_k", i, ".so");
    std::ofstream(f) << std::string(1000, 'x');
    fs::last_write_time(f, now - std::chrono::hours(10 - i));
  }
  std::ofstream(dir / "notes.txt") << std::string(5000, 'y');  // not a kernel: never removed
  auto cg = CpuCodegen::Create({.cache_dir = dir.string(), .cache_limit_bytes = 5000});
  ASSERT_TRUE(cg.ok()) << cg.status().ToString();
  EXPECT_EQ((*cg)->stats().pruned, 7);  // 10000 bytes -> 3000, within 3/4 of 5000
  for (int i = 0; i < 10; ++i) EXPECT_EQ(fs::exists(dir / StrCat("gf_cpu_k", i, ".so")), i >= 7) << i;
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));
  // Under the bound: nothing goes.
  auto again = CpuCodegen::Create({.cache_dir = dir.string(), .cache_limit_bytes = 5000});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->stats().pruned, 0);

  // A kernel loaded from the cache is marked used: it outlives older unused ones.
  const fs::path real = dir / "real";
  std::mt19937 rng(11);
  Tensor x = Random(DType::kF32, {256}, rng);
  std::vector<float> out(256);
  const cpu::TileProgram p = UnaryChain(x, out.data(), {OpKind::kAbs, OpKind::kExp});
  {
    auto first = CpuCodegen::Create({.cache_dir = real.string()});
    ASSERT_TRUE(first.ok());
    ASSERT_TRUE(cpu::TileRunner(p, first->get()).native());
  }
  fs::path compiled;
  for (const auto& e : fs::directory_iterator(real))
    if (e.path().extension() == ".so") compiled = e.path();
  ASSERT_FALSE(compiled.empty());
  fs::last_write_time(compiled, now - std::chrono::hours(100));  // looks old ...
  {
    auto second = CpuCodegen::Create({.cache_dir = real.string()});
    ASSERT_TRUE(second.ok());
    ASSERT_TRUE(cpu::TileRunner(p, second->get()).native());
    EXPECT_EQ((*second)->stats().loaded, 1);
  }
  EXPECT_GT(fs::last_write_time(compiled), now - std::chrono::hours(1)) << "... until it is used";
}

// A cache directory whose path holds spaces and quotes works (paths reach the shell quoted).
TEST(CpuCodegen, CacheDirectoryWithSpacesAndQuotes) {
  auto cg = CpuCodegen::Create({.cache_dir = CacheDir() + "/it's a \"dir\" with spaces"});
  ASSERT_TRUE(cg.ok()) << cg.status().ToString();
  std::mt19937 rng(10);
  Tensor x = Random(DType::kF32, {256}, rng);
  std::vector<float> out(256);
  const cpu::TileRunner r(UnaryChain(x, out.data(), {OpKind::kAbs, OpKind::kNeg}), cg->get());
  EXPECT_TRUE(r.native()) << (*cg)->stats().last_error;
  r.Launch(CpuContext{});
  for (int i = 0; i < 256; ++i) ASSERT_EQ(out[i], -std::fabs(x.data_as<float>()[i])) << i;
}

// A runner keeps its loop's code loaded after the generator that compiled it is gone.
TEST(CpuCodegen, RunnerOutlivesItsGenerator) {
  std::mt19937 rng(8);
  Tensor x = Random(DType::kF32, {2048}, rng);
  std::vector<float> out(2048);
  cpu::TileProgram p = UnaryChain(x, out.data(), {OpKind::kNeg, OpKind::kExp});
  std::optional<cpu::TileRunner> runner;
  {
    auto cg = CpuCodegen::Create({.cache_dir = CacheDir() + "/shared"});
    ASSERT_TRUE(cg.ok()) << cg.status().ToString();
    runner.emplace(p, cg->get());
    ASSERT_TRUE(runner->native());
  }
  runner->Launch(CpuContext{});
  std::vector<float> want(2048);
  p.outputs[0].data = want.data();
  cpu::RunTileProgram(p, CpuContext{});
  EXPECT_EQ(0, std::memcmp(out.data(), want.data(), sizeof(float) * 2048));
}

// The generated source names what it fuses and keeps every intermediate in a register.
TEST(CpuCodegen, SourceIsOneLoopOverRegisters) {
  cpu::NativeProgram np;
  np.inputs = {cpu::NativeRead::kRow, cpu::NativeRead::kScalar, cpu::NativeRead::kPerRow};
  np.input_dtypes = {DType::kBF16, DType::kF32, DType::kF16};
  np.instrs = {{OpKind::kMul, {0, 1, 0}, {}, cpu::Domain::kF32}, {OpKind::kAdd, {3, 2, 0}, {}, cpu::Domain::kF32}};
  np.outputs = {4, 3};
  np.output_dtypes = {DType::kF32, DType::kF16};
  const std::string s = cpu::NativeSource(np, "k");
  EXPECT_NE(s.find("// graphfuse CPU kernel: Mul, Add"), std::string::npos) << s;
  EXPECT_NE(s.find("const VF r0 = LoadBF16(in[0], b0 + j);"), std::string::npos) << s;
  EXPECT_NE(s.find("const VF r2 = VF(static_cast<double>(ScalarF16(in[2], row * rs[2])));"), std::string::npos) << s;
  EXPECT_NE(s.find("const VF r3 = MulRow::Eval<VF, int64_t>(r0, r1, r0, a[0], i + j);"), std::string::npos) << s;
  EXPECT_NE(s.find("const VF r4 = AddRow::Eval<VF, int64_t>(r3, r2, r3, a[1], i + j);"), std::string::npos) << s;
  EXPECT_NE(s.find("StreamF32(r4, out[0], i + j);"), std::string::npos) << s;
  EXPECT_NE(s.find("StoreF32(r4, out[0], i + j);"), std::string::npos) << s;
  EXPECT_NE(s.find("StoreF16(r3, out[1], i + j);"), std::string::npos) << s;
  EXPECT_NE(s.find("const VF r0 = LoadTailBF16(in[0], b0 + j, n - j);"), std::string::npos) << s;
  EXPECT_NE(s.find("hwy::Prefetch(static_cast<const char*>(in[0]) + (b0 + j + 256) * 2);"), std::string::npos)
      << "the streamed loop prefetches its row inputs:\n" << s;
  EXPECT_NE(s.find("StoreTailF16(r3, out[1], i + j, n - j);"), std::string::npos) << s;
  EXPECT_EQ(s.find("StreamF16"), std::string::npos) << "f16 outputs are never streamed:\n" << s;
}

}  // namespace
}  // namespace graphfuse
