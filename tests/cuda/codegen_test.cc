// The CUDA code generator, checked without a GPU (label `cuda`):
//   - every op-table row as a single-op kernel (f32, f16, bf16; i32, i64 for kIntOk rows; bool
//     for the logical rows) and a corpus of fused groups built by the real planner
//     (ParseGraph + FuseElementwise) are generated and compiled with NVRTC -- all must compile;
//   - kernel names say what they fuse;
//   - a snapshot ("process replay"): the generated source of a fixed corpus must equal
//     tests/golden/<case>.cu byte for byte, so a refactor of the generator is provably neutral
//     or shows its diff. After an intended change, regenerate and review the diff:
//         GF_UPDATE_GOLDEN=1 ./graphfuse_cuda_tests --gtest_filter='*Golden*'
//   - tests that need a GPU skip with "no CUDA device: runtime tests need a GPU".
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cuda/codegen.h"
#include "cuda/nvrtc_compile.h"
#include "graphfuse/ops.h"
#include "cuda/device_prelude.h"
#include "ir/text.h"
#include "ops/philox.h"
#include "passes/fuse_elementwise.h"

namespace graphfuse::cuda {
namespace {

#ifndef GF_GOLDEN_DIR
#define GF_GOLDEN_DIR ""
#endif

std::filesystem::path GoldenDir() {
  if (std::string(GF_GOLDEN_DIR).size()) return GF_GOLDEN_DIR;
  return std::filesystem::path(__FILE__).parent_path().parent_path() / "golden";
}

// Compiles every kernel on all cores with one shared compiler; returns the failures.
std::vector<std::string> CompileAll(const std::vector<CudaKernelSource>& kernels, NvrtcCompiler& compiler,
                                    double* seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<size_t> next{0};
  std::vector<std::string> errors(kernels.size());
  auto worker = [&] {
    for (size_t i; (i = next++) < kernels.size();) {
      auto r = compiler.Compile(kernels[i]);
      if (!r.ok()) errors[i] = r.status().ToString();
      else if (r->image.find(kernels[i].name) == std::string::npos) errors[i] = kernels[i].name + ": symbol not in PTX";
    }
  };
  std::vector<std::thread> pool;
  const unsigned n = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  for (unsigned t = 0; t < n; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<std::string> failed;
  for (const std::string& e : errors)
    if (!e.empty()) failed.push_back(e);
  return failed;
}

// ---- single-op kernels ---------------------------------------------------------------------

// One node of `op` on `dt` data over [4,256], its last operand broadcast from [256].
Result<CudaKernelSource> SingleOpKernel(const OpInfo& op, DType dt, AttributeMap attrs = {}) {
  Graph g("single");
  std::vector<Value*> ins;
  for (int k = 0; k < op.arity; ++k) {
    const bool cond = op.cls == OpClass::kSelect && k == 0;
    const Shape shape = (k > 0 && k == op.arity - 1) ? Shape{256} : Shape{4, 256};
    GF_ASSIGN_OR_RETURN(Value * v, g.AddInput(StrCat("x", k), cond ? DType::kBool : dt, shape));
    ins.push_back(v);
  }
  GF_ASSIGN_OR_RETURN(Node * n, g.AddNode(op.name, ins, std::move(attrs), StrCat(op.name, "_0")));
  return GenerateKernelForNode(*n);
}

std::vector<CudaKernelSource> SingleOpCorpus() {
  std::vector<CudaKernelSource> out;
  auto add = [&](const OpInfo& op, DType dt, AttributeMap attrs = {}) {
    auto k = SingleOpKernel(op, dt, attrs);
    EXPECT_TRUE(k.ok()) << op.name << " " << DTypeName(dt) << ": " << k.status().ToString();
    if (!k.ok()) return;
    std::string op_lower = op.name;
    for (char& c : op_lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    EXPECT_EQ(k->name.rfind(op_lower + "_", 0), 0u) << k->name;
    out.push_back(std::move(*k));
  };
  for (const OpInfo& op : AllOps()) {
    if (op.cls == OpClass::kLogical) {
      add(op, DType::kBool);
      continue;
    }
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      if (op.kind == OpKind::kCast) {
        for (DType to : kAllDTypes) add(op, dt, {{"to", static_cast<int64_t>(to)}});
        continue;
      }
      add(op, dt);
      if (op.kind == OpKind::kDropout) add(op, dt, {{"alpha", 0.25f}, {"seed", int64_t{7}}, {"training", int64_t{1}}});
    }
    if (op.int_ok)
      for (DType dt : {DType::kI32, DType::kI64}) {
        if (op.kind == OpKind::kCast) {
          for (DType to : kAllDTypes) add(op, dt, {{"to", static_cast<int64_t>(to)}});
          continue;
        }
        add(op, dt);
      }
  }
  return out;
}

// ---- fused groups, built by the planner ----------------------------------------------------

struct FusedCase {
  const char* name;
  const char* kernel_prefix;  // what the kernel name must start with
  const char* ir;
};

const FusedCase kFusedCases[] = {
    {"chain", "fused_add_mul_add_f32_", R"(graph @chain(%x: f32[64,4096], %y: f32[64,4096], %b: f32[4096]) {
  %s: f32[] = const [0.125]
  %0 = Add(%x, %y)
  %1 = Mul(%0, %s)
  %u = Add(%1, %b)
  return %u
})"},
    {"gelu", "fused_mul_add_gelu_f32_", R"(graph @gelu(%x: f32[8,1024], %s: f32[], %b: f32[1024]) {
  %0 = Mul(%x, %s)
  %1 = Add(%0, %b)
  %2 = Gelu(%1)
  return %2
})"},
    {"silu", "fused_silu_mul_f32_", R"(graph @swiglu(%g: f32[16,11008], %u: f32[16,11008]) {
  %0 = Silu(%g)
  %1 = Mul(%0, %u)
  return %1
})"},
    {"residual6", "fused_add_relu_mul_add_tanh_scale_f32_", R"(graph @res(%x: f32[32,768], %b: f32[768], %g: f32[768], %r: f32[32,768]) {
  %0 = Add(%x, %b)
  %1 = Relu(%0)
  %2 = Mul(%1, %g)
  %3 = Add(%2, %r)
  %4 = Tanh(%3)
  %5 = Scale(%4) {alpha = 0.5}
  return %5
})"},
    {"diamond", "fused_mul_gelu_sigmoid_mul_silu_f32_", R"(graph @d(%x: f32[3,1000], %s: f32[1000]) {
  %0 = Mul(%x, %s)
  %1 = Gelu(%0)
  %2 = Sigmoid(%0)
  %3 = Mul(%1, %2)
  %4 = Silu(%3)
  return %4
})"},
    {"multi_output", "fused_add_relu_f32_", R"(graph @m(%x: f32[512], %y: f32[512], %w: f32[512,512]) {
  %t = Add(%x, %y)
  %r = Relu(%t)
  %m = MatMul(%t, %w)
  return %r, %m
})"},
    {"f16_chain", "fused_add_gelu_mul_f16_", R"(graph @h(%x: f16[32,1024], %b: f16[1024], %y: f16[32,1024]) {
  %0 = Add(%x, %b)
  %1 = Gelu(%0)
  %2 = Mul(%1, %y)
  return %2
})"},
    {"bf16_chain", "fused_mul_sigmoid_add_bf16_", R"(graph @bh(%x: bf16[32,1024], %s: bf16[1024], %y: bf16[32,1024]) {
  %0 = Mul(%x, %s)
  %1 = Sigmoid(%0)
  %2 = Add(%1, %y)
  return %2
})"},
    {"cast_f16", "fused_cast_mul_f16_", R"(graph @c(%x: f32[64,64], %y: f16[64,64]) {
  %0 = Cast(%x) {to = 1}
  %1 = Mul(%0, %y)
  return %1
})"},
    {"where_less", "fused_less_where_mul_f32_", R"(graph @w(%x: f32[128,64], %y: f32[128,64], %s: f32[64]) {
  %c = Less(%x, %y)
  %m = Where(%c, %y, %x)
  %o = Mul(%m, %s)
  return %o
})"},
    {"dropout", "fused_add_dropout_mul_f32_", R"(graph @drop(%x: f32[16,1024], %b: f32[1024], %s: f32[16,1024]) {
  %0 = Add(%x, %b)
  %1 = Dropout(%0) {alpha = 0.1, seed = 1234, training = 1}
  %2 = Mul(%1, %s)
  return %2
})"},
    {"i32_chain", "fused_add_mul_max_i32_", R"(graph @i(%x: i32[4,100], %y: i32[100], %z: i32[4,100]) {
  %0 = Add(%x, %y)
  %1 = Mul(%0, %z)
  %2 = Max(%1, %x)
  return %2
})"},
};

// The FusedElementwise kernels of one case (exactly one group expected).
Result<CudaKernelSource> FusedKernel(const FusedCase& c) {
  GF_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, ParseGraph(c.ir));
  GF_ASSIGN_OR_RETURN(FusionReport rep, FuseElementwise(*g));
  const Node* fused = nullptr;
  int groups = 0;
  for (const auto& n : g->nodes())
    if (n->op() == "FusedElementwise") fused = n.get(), ++groups;
  if (groups != 1) return InvalidArgument("case ", c.name, ": expected one fused group, got ", groups);
  GF_ASSIGN_OR_RETURN(CudaKernelSource k, GenerateKernelForNode(*fused));
  if (k.name != fused->GetString("kernel_name", "")) return InvalidArgument("case ", c.name, ": name not reused");
  return k;
}

TEST(CudaCodegen, EveryOpRowCompilesAsASingleOpKernel) {
  const std::vector<CudaKernelSource> kernels = SingleOpCorpus();
  ASSERT_GT(kernels.size(), 100u);
  NvrtcCompiler compiler;
  double seconds = 0;
  const std::vector<std::string> failed = CompileAll(kernels, compiler, &seconds);
  for (const std::string& f : failed) ADD_FAILURE() << f;
  std::printf("[ cuda     ] %zu single-op kernels compiled by NVRTC %s in %.1f s\n", kernels.size(),
              NvrtcCompiler::NvrtcVersion().c_str(), seconds);
}

TEST(CudaCodegen, FusedCorpusCompilesAndNamesSayWhatTheyFuse) {
  std::vector<CudaKernelSource> kernels;
  for (const FusedCase& c : kFusedCases) {
    auto k = FusedKernel(c);
    ASSERT_TRUE(k.ok()) << c.name << ": " << k.status().ToString();
    EXPECT_EQ(k->name.rfind(c.kernel_prefix, 0), 0u) << c.name << ": " << k->name;
    EXPECT_EQ(k->name.size(), std::string(c.kernel_prefix).size() + 8) << k->name;  // + hash8
    kernels.push_back(std::move(*k));
  }
  NvrtcCompiler compiler;
  double seconds = 0;
  for (const std::string& f : CompileAll(kernels, compiler, &seconds)) ADD_FAILURE() << f;
  std::printf("[ cuda     ] %zu fused kernels compiled in %.1f s\n", kernels.size(), seconds);
}

TEST(CudaCodegen, KernelShapeFollowsTheGroup) {
  auto chain = FusedKernel(kFusedCases[0]);
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  const std::string& s = chain->source;
  EXPECT_TRUE(chain->has_vector_path);  // dense x, y; scalar s; row-broadcast b[4096]
  EXPECT_NE(s.find("float4"), std::string::npos);
  EXPECT_NE(s.find("(static_cast<unsigned>(i) % 4096u)"), std::string::npos) << s;
  EXPECT_NE(s.find("return x + y; }"), std::string::npos);  // the row, stringized
  EXPECT_EQ(s.find("__expf"), std::string::npos);
  EXPECT_EQ(chain->num_elements, 64 * 4096);

  auto f16 = FusedKernel(kFusedCases[6]);
  ASSERT_TRUE(f16.ok()) << f16.status().ToString();
  EXPECT_FALSE(f16->has_vector_path);
  size_t rounds = 0;
  for (size_t p = 0; (p = f16->source.find("= gf::round_f16(", p)) != std::string::npos; ++p) ++rounds;
  EXPECT_EQ(rounds, 3u);  // after each of the 3 f16 intermediates, as the CPU lowering does

  auto ints = FusedKernel(kFusedCases[11]);
  ASSERT_TRUE(ints.ok()) << ints.status().ToString();
  EXPECT_NE(ints->source.find("gf::i64 r3 = gf::op_Add<gf::i64>(r0, r1, gf::i64(0), a3, idx);"), std::string::npos) << ints->source;
}

// The device prelude's Philox is a copy of src/ops/philox.h (it cannot include a host header):
// its constants must be the host's, so CPU and GPU draw the same Dropout mask.
TEST(CudaCodegen, PreludePhiloxConstantsMatchTheHost) {
  const std::string prelude = kDevicePrelude;
  for (uint32_t c : {kPhiloxM0, kPhiloxM1, kPhiloxW0, kPhiloxW1}) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%08Xu", c);
    EXPECT_NE(prelude.find(hex), std::string::npos) << hex;
  }
  EXPECT_NE(prelude.find("16777216.0"), std::string::npos);  // the 24-bit integer threshold
}

TEST(CudaCodegen, RefusesWhatItCannotCompile) {
  auto g = ParseGraph(R"(graph @x(%a: f32[4,8], %w: f32[8,8]) {
  %0 = MatMul(%a, %w)
  return %0
})");
  ASSERT_TRUE(g.ok());
  auto k = GenerateElementwiseKernel(**g);
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("MatMul"), std::string::npos) << k.status().ToString();
}

TEST(Nvrtc, ErrorsNameTheKernelAndCarryTheLog) {
  NvrtcCompiler compiler;
  auto r = compiler.Compile("broken_kernel", "extern \"C\" __global__ void broken_kernel() { undeclared(); }");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("broken_kernel"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("undeclared"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("compute_90"), std::string::npos);
}

TEST(Nvrtc, CachesInMemoryAndOnDisk) {
  auto k = FusedKernel(kFusedCases[2]);
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / StrCat("gf_nvrtc_cache_test_", ::getpid());
  std::filesystem::remove_all(dir);
  {
    NvrtcCompiler a({.arch = "sm_90", .cache_dir = dir.string(), .extra_options = {}});
    auto first = a.Compile(*k);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    EXPECT_TRUE(first->is_cubin);
    EXPECT_FALSE(first->from_cache);
    auto again = a.Compile(*k);
    ASSERT_TRUE(again.ok());
    EXPECT_TRUE(again->from_cache);
    EXPECT_EQ(again->image, first->image);
    EXPECT_EQ(a.nvrtc_runs(), 1);
  }
  NvrtcCompiler b({.arch = "sm_90", .cache_dir = dir.string(), .extra_options = {}});
  auto disk = b.Compile(*k);
  ASSERT_TRUE(disk.ok());
  EXPECT_TRUE(disk->from_cache);
  EXPECT_EQ(b.nvrtc_runs(), 0);
  std::filesystem::remove_all(dir);
}

// ---- the snapshot ----------------------------------------------------------------------------

TEST(CudaCodegen, GoldenSources) {
  const bool update = [] {
    const char* e = std::getenv("GF_UPDATE_GOLDEN");
    return e && std::string(e) == "1";
  }();
  for (const char* name : {"chain", "gelu", "silu", "f16_chain", "dropout"}) {
    const FusedCase* c = nullptr;
    for (const FusedCase& fc : kFusedCases)
      if (std::string(fc.name) == name) c = &fc;
    ASSERT_NE(c, nullptr);
    auto k = FusedKernel(*c);
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    const std::filesystem::path file = GoldenDir() / StrCat(name, ".cu");
    if (update) {
      std::filesystem::create_directories(file.parent_path());
      std::ofstream(file, std::ios::binary) << k->source;
      continue;
    }
    std::ifstream f(file, std::ios::binary);
    ASSERT_TRUE(f.good()) << file << " is missing; run with GF_UPDATE_GOLDEN=1 to create it";
    std::stringstream want;
    want << f.rdbuf();
    EXPECT_EQ(k->source, want.str()) << "generated source of '" << name << "' differs from " << file
                                     << "; if intended, rerun with GF_UPDATE_GOLDEN=1 and review the diff";
  }
}

// ---- needs a GPU ---------------------------------------------------------------------------

TEST(CudaRuntime, DeviceIsPresent) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device: runtime tests need a GPU";
  EXPECT_GT(count, 0);
}

}  // namespace
}  // namespace graphfuse::cuda
