// The CUDA code generator, checked without a GPU (label `cuda`):
//   - every op-table row as a single-op kernel (f32, f16, bf16; i32, i64 for kIntOk rows; bool
//     for the logical rows) and a corpus of fused groups built by the real planner
//     (ParseGraph + FuseElementwise) are generated and compiled with NVRTC -- all must compile;
//   - kernel names say what they fuse;
//   - a snapshot ("process replay"): the generated source of a fixed corpus must equal
//     tests/golden/<case>.cu byte for byte (the device prelude they all start with is kept once,
//     as prelude.cuh: golden.h), so a refactor of the generator is provably neutral or shows its
//     diff. After an intended change, regenerate and review the diff:
//         GF_UPDATE_GOLDEN=1 ./graphfuse_cuda_tests --gtest_filter='*Golden*'
//   - tests that need a GPU skip with "no CUDA device: runtime tests need a GPU".
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "cuda/cuda_target.h"
#include "cuda/codegen.h"
#include "golden.h"
#include "../graph_test_util.h"
#include "cuda/cuda_executor.h"
#include "cuda/nvrtc_compile.h"
#include "graphfuse/ops.h"
#include "graphfuse/thread_pool.h"
#include "cuda/device_prelude.h"
#include "ir/text.h"
#include "onnx/import.h"
#include "ops/philox.h"
#include "passes/fuse_elementwise.h"
#include "passes/pipeline.h"
#include "testing/blocks.h"
#include "cpu/executor.h"
#include "narrow_twin.h"

namespace graphfuse::cuda {
namespace {


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
  // The fusion's name and the kernel's say the same before their hashes (the fusion's hashes the
  // sizes, the kernel's its size-free source).
  const std::string fusion_name = fused->GetString("kernel_name", "");
  if (k.name.size() != fusion_name.size() || k.name.compare(0, k.name.size() - 8, fusion_name, 0, k.name.size() - 8) != 0)
    return InvalidArgument("case ", c.name, ": kernel '", k.name, "' does not say what fusion '", fusion_name, "' does");
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
  EXPECT_NE(s.find("(static_cast<unsigned>(i) % dim1)"), std::string::npos) << s;  // b's row, a size
  EXPECT_NE(s.find("return x + y; }"), std::string::npos);  // the row, stringized
  EXPECT_EQ(s.find("__expf"), std::string::npos);
  EXPECT_EQ(chain->num_elements, 64 * 4096);
  EXPECT_EQ(chain->sizes, (std::vector<int64_t>{64 * 4096, 1, 4096}));  // n, the float4 loop runs, b's row
  // The sizes are parameters: the same group over other rows is the same source and kernel, with
  // other sizes; rows of an odd length leave the float4 loop to the scalar one at run time.
  for (const char* other : {"f32[3,4096]", "f32[5,4095]"}) {
    std::string ir = kFusedCases[0].ir;
    for (size_t at; (at = ir.find("f32[64,4096]")) != std::string::npos;) ir.replace(at, 12, other);
    const std::string row = std::string(other).substr(6, 4);
    ir.replace(ir.find("f32[4096]"), 9, "f32[" + row + "]");
    auto g = ParseGraph(ir);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    ASSERT_TRUE(FuseElementwise(**g).ok());
    const Node* fused = nullptr;
    for (const auto& n : (*g)->nodes())
      if (n->op() == "FusedElementwise") fused = n.get();
    ASSERT_NE(fused, nullptr);
    auto again = GenerateKernelForNode(*fused);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->name, chain->name) << other;
    EXPECT_EQ(again->source, chain->source) << other;
    const int64_t rows = other[4] - '0', len = std::stoll(row);
    EXPECT_EQ(again->sizes, (std::vector<int64_t>{rows * len, len % 4 == 0 ? 1 : 0, len})) << other;
    EXPECT_EQ(again->has_vector_path, len % 4 == 0) << other;
  }

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

// ---- around the GEMMs: norms, softmax, RoPE, GEMM epilogues -----------------------------------

// The graph of `ir` after the whole fusion pipeline.
Result<std::unique_ptr<Graph>> Pipelined(const std::string& ir) {
  GF_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, ParseGraph(ir));
  GF_RETURN_IF_ERROR(RunPipeline(*g, cuda::DefaultCudaTarget()).status());
  return g;
}

const Node* Only(const Graph& g, const std::string& op) {
  const Node* found = nullptr;
  for (const auto& n : g.nodes())
    if (n->op() == op) {
      EXPECT_EQ(found, nullptr) << "more than one " << op;
      found = n.get();
    }
  EXPECT_NE(found, nullptr) << "no " << op << " in\n" << PrintGraph(g);
  return found;
}

struct RowCase {
  const char* name;
  const char* op;             // the node to generate for, after the pipeline
  const char* kernel_prefix;  // the kernel name up to the dtype
  const char* ir;
};

const RowCase kRowCases[] = {
    // 300 = one full pass of 256 threads and a ragged second one.
    {"rmsnorm", "RMSNorm", "rmsnorm_f32_", R"(graph @n(%x: f32[4,300], %w: f32[300]) {
  %y = RMSNorm(%x, %w) {epsilon = 1e-6}
  return %y
})"},
    {"layernorm_stats", "LayerNormalization", "layernorm_f32_", R"(graph @n(%x: f32[3,64], %g: f32[64], %b: f32[64]) {
  %y, %mean, %inv = LayerNormalization(%x, %g, %b) {epsilon = 1e-5}
  return %y, %mean, %inv
})"},
    {"softmax", "Softmax", "softmax_f32_", R"(graph @s(%x: f32[2,5,77]) {
  %y = Softmax(%x) {axis = -1}
  return %y
})"},
    {"softmax_f16", "Softmax", "softmax_f16_", R"(graph @s(%x: f16[8,1000]) {
  %y = Softmax(%x) {axis = -1}
  return %y
})"},
    // The pre-norm residual stream: the sum is a second output.
    {"add_rmsnorm", "FusedNorm", "fused_add_rmsnorm_f32_", R"(graph @n(%x: f32[16,4096], %r: f32[16,4096], %w: f32[4096]) {
  %s = Add(%x, %r)
  %y = RMSNorm(%s, %w) {epsilon = 1e-6}
  return %y, %s
})"},
    {"add_layernorm", "FusedNorm", "fused_add_add_layernorm_f32_", R"(graph @n(%x: f32[8,768], %b: f32[768], %r: f32[8,768], %g: f32[768], %c: f32[768]) {
  %0 = Add(%x, %b)
  %1 = Add(%0, %r)
  %y = LayerNormalization(%1, %g, %c) {epsilon = 1e-5}
  return %y
})"},
    {"scale_mask_softmax_dropout", "FusedSoftmax", "fused_mul_add_softmax_mul_f32_", R"(graph @a(%s: f32[2,4,32,32], %k: f32[], %m: f32[1,1,32,32], %keep: f32[2,4,32,32]) {
  %0 = Mul(%s, %k)
  %1 = Add(%0, %m)
  %p = Softmax(%1) {axis = -1}
  %d = Mul(%p, %keep)
  return %d
})"},
    {"rope", "Rope", "rope_f32_", R"(graph @r(%x: f32[1,4,16,64], %c: f32[16,64], %s: f32[16,64]) {
  %y = Rope(%x, %c, %s)
  return %y
})"},
};

TEST(CudaCodegen, RowKernelsCompileAndNamesSayWhatTheyFuse) {
  std::vector<CudaKernelSource> kernels;
  for (const RowCase& c : kRowCases) {
    auto g = Pipelined(c.ir);
    ASSERT_TRUE(g.ok()) << c.name << ": " << g.status().ToString();
    const Node* n = Only(**g, c.op);
    ASSERT_NE(n, nullptr) << c.name;
    auto k = GenerateKernelForNode(*n);
    ASSERT_TRUE(k.ok()) << c.name << ": " << k.status().ToString();
    EXPECT_EQ(k->name.rfind(c.kernel_prefix, 0), 0u) << c.name << ": " << k->name;
    EXPECT_EQ(k->input_dtypes.size(), n->inputs().size()) << c.name;
    EXPECT_EQ(k->output_dtypes.size(), n->outputs().size()) << c.name;
    kernels.push_back(std::move(*k));
  }
  NvrtcCompiler compiler;
  double seconds = 0;
  for (const std::string& f : CompileAll(kernels, compiler, &seconds)) ADD_FAILURE() << f;
}

// The pipelined LLaMA block's FusedAttention (RoPE, causal mask) as the CUDA backend runs it:
// the QKV GEMM apart from the attention.
Result<std::unique_ptr<Graph>> LlamaAttentionGraph() {
  const std::filesystem::path model = std::filesystem::path(GF_MODELS_DIR) / "llama_block_opset17" / "model.onnx";
  GF_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, ImportOnnxFile(model.string()));
  PipelineOptions two_nodes;
  two_nodes.fusion.attention_projection = false;
  GF_RETURN_IF_ERROR(RunPipeline(*g, cuda::DefaultCudaTarget(), two_nodes).status());
  return g;
}

// Every row kernel kind -- RMSNorm, LayerNormalization (with its statistics), Softmax, the
// fused norms and softmaxes, RoPE, attention in one kernel and the GEMM form's prep and softmax
// kernels -- rebuilt over f32, f16 and bf16 (tests/cuda/narrow_twin.h), generated and compiled
// with NVRTC; names carry the dtype.
TEST(CudaCodegen, RowKernelsCompileInEveryFloatDType) {
  std::vector<CudaKernelSource> kernels;
  auto add = [&](const Node& n, DType dt, std::optional<DType> out_dt, const std::string& what) {
    auto twin = NarrowTwin(n, dt, out_dt);
    ASSERT_TRUE(twin.ok()) << what << ": " << twin.status().ToString();
    if (n.op() == "FusedAttention" && out_dt) {
      auto gk = GenerateAttentionGemmKernels(*twin->node);
      ASSERT_TRUE(gk.ok()) << what << ": " << gk.status().ToString();
      EXPECT_EQ(gk->prep.input_dtypes[0], dt) << what;
      kernels.push_back(gk->prep);
      kernels.push_back(gk->softmax);
      return;
    }
    auto k = GenerateKernelForNode(*twin->node);
    ASSERT_TRUE(k.ok()) << what << ": " << k.status().ToString();
    EXPECT_NE(k->name.find(StrCat("_", DTypeName(dt), "_")), std::string::npos) << what << ": " << k->name;
    EXPECT_EQ(k->output_dtypes[0], dt) << what;
    kernels.push_back(std::move(*k));
  };
  for (const RowCase& c : kRowCases) {
    auto g = Pipelined(c.ir);
    ASSERT_TRUE(g.ok()) << c.name << ": " << g.status().ToString();
    const Node* n = Only(**g, c.op);
    ASSERT_NE(n, nullptr) << c.name;
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) add(*n, dt, std::nullopt, StrCat(c.name, " ", DTypeName(dt)));
  }
  auto lg = LlamaAttentionGraph();
  ASSERT_TRUE(lg.ok()) << lg.status().ToString();
  const Node* fa = Only(**lg, "FusedAttention");
  ASSERT_NE(fa, nullptr);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    add(*fa, dt, std::nullopt, StrCat("attention ", DTypeName(dt)));
    add(*fa, dt, DType::kF32, StrCat("attention as GEMMs ", DTypeName(dt)));  // cuBLAS's p v writes f32
  }
  EXPECT_EQ(kernels.size(), std::size(kRowCases) * 3 + 3 * 3);
  NvrtcCompiler compiler;
  double seconds = 0;
  for (const std::string& f : CompileAll(kernels, compiler, &seconds)) ADD_FAILURE() << f;
}

TEST(CudaCodegen, RowKernelsRefuseWhatTheyDoNotGenerate) {
  auto g = ParseGraph(R"(graph @s(%x: f32[4,8]) {
  %y = Softmax(%x) {axis = 0}
  return %y
})");
  ASSERT_TRUE(g.ok());
  auto k = GenerateKernelForNode(*Only(**g, "Softmax"));
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("axis 0"), std::string::npos) << k.status().ToString();
  auto long_rows = ParseGraph(R"(graph @n(%x: f32[2,9000]) {
  %y = RMSNorm(%x)
  return %y
})");
  ASSERT_TRUE(long_rows.ok());
  auto k2 = GenerateKernelForNode(*Only(**long_rows, "RMSNorm"));
  ASSERT_FALSE(k2.ok());
  EXPECT_NE(k2.status().message().find("9000"), std::string::npos) << k2.status().ToString();
}

// x[8,32] @ w[32,64] (a constant), then Add with a constant bias [64] (or a residual input
// [8,64]), then `act` (none when empty); after the whole pipeline.
Result<std::unique_ptr<Graph>> GemmGraph(const std::string& act, bool bias_first, bool residual) {
  auto g = std::make_unique<Graph>("gemm");
  auto filled = [](const Shape& s) {
    auto t = std::make_shared<Tensor>(Tensor::Empty(DType::kF32, s).value());
    for (int64_t i = 0; i < t->numel(); ++i) t->data_as<float>()[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
    return t;
  };
  GF_ASSIGN_OR_RETURN(Value * x, g->AddInput("x", DType::kF32, {8, 32}));
  GF_ASSIGN_OR_RETURN(Value * w, g->AddConstant("w", filled({32, 64})));
  GF_ASSIGN_OR_RETURN(Node * mm, g->AddNode("MatMul", {x, w}, {}, "mm"));
  Value* other = nullptr;
  if (residual) {
    GF_ASSIGN_OR_RETURN(other, g->AddInput("r", DType::kF32, {8, 64}));
  } else {
    GF_ASSIGN_OR_RETURN(other, g->AddConstant("b", filled({64})));
  }
  std::vector<Value*> add_in = bias_first ? std::vector<Value*>{other, mm->output()} : std::vector<Value*>{mm->output(), other};
  GF_ASSIGN_OR_RETURN(Node * add, g->AddNode("Add", add_in, {}, "add"));
  Value* out = add->output();
  if (!act.empty()) {
    GF_ASSIGN_OR_RETURN(Node * a, g->AddNode(act, {out}, {}, "act"));
    out = a->output();
  }
  GF_RETURN_IF_ERROR(g->MarkOutput(out));
  GF_RETURN_IF_ERROR(RunPipeline(*g, cuda::DefaultCudaTarget()).status());
  return g;
}

TEST(CudaCodegen, GemmEpiloguesGoToCublasLtOnlyWhereItsEnumIsExact) {
  struct Case {
    const char* act;
    bool bias_first, residual;
    CublasLtEpilogue::Kind want;
  } cases[] = {
      {"", false, false, CublasLtEpilogue::kBias},
      {"GeluTanh", true, false, CublasLtEpilogue::kGeluTanhBias},
      {"Relu", false, false, CublasLtEpilogue::kReluBias},
      // GELU (erf) is not cuBLASLt's GELU (tanh): a generated epilogue, never an approximation.
      {"Gelu", false, false, CublasLtEpilogue::kNotCovered},
      // A residual add is cuBLASLt's C operand (beta = 1), in either operand order.
      {"", false, true, CublasLtEpilogue::kNone},
      {"", true, true, CublasLtEpilogue::kNone},
      // ... but not under an activation (cuBLASLt applies it after C).
      {"Relu", false, true, CublasLtEpilogue::kNotCovered},
  };
  std::vector<CudaKernelSource> kernels;
  for (const Case& c : cases) {
    const std::string what = StrCat("act '", c.act, "', residual ", c.residual);
    auto g = GemmGraph(c.act, c.bias_first, c.residual);
    ASSERT_TRUE(g.ok()) << what << ": " << g.status().ToString();
    const Node* n = Only(**g, "FusedGemm");
    ASSERT_NE(n, nullptr) << what;
    EXPECT_EQ(CublasLtEpilogueFor(*n).kind, c.want) << what;
    EXPECT_EQ(CublasLtEpilogueFor(*n).residual_input, c.residual && c.want != CublasLtEpilogue::kNotCovered ? 2 : -1)
        << what;
    auto plan = PlanNodeForCuda(*n);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    const bool covered = c.want != CublasLtEpilogue::kNotCovered;
    EXPECT_EQ(plan->path, covered ? CudaPath::kCublas : CudaPath::kCublasThenKernel) << what;
    EXPECT_EQ(plan->kernels.size(), covered ? 0u : 1u) << what;
    for (CudaKernelSource& k : plan->kernels) kernels.push_back(std::move(k));
  }
  NvrtcCompiler compiler;
  double seconds = 0;
  for (const std::string& f : CompileAll(kernels, compiler, &seconds)) ADD_FAILURE() << f;
}

// x @ w + b + r (bias, then a residual of the output's shape): cuBLASLt's BIAS epilogue with the
// residual as C; a residual added before the bias, or a broadcast "residual", is not taken.
TEST(CudaCodegen, BiasThenResidualIsCublasLtBiasWithC) {
  struct Case {
    bool residual_first;
    Shape r_shape;
    bool covered;
  } cases[] = {{false, {8, 64}, true}, {true, {8, 64}, false}, {false, {1, 64}, false}};
  for (const Case& c : cases) {
    SCOPED_TRACE(StrCat("residual first ", c.residual_first, ", r ", ShapeToString(c.r_shape)));
    Graph g("gemm_bias_res");
    auto filled = [](const Shape& s) {
      auto t = std::make_shared<Tensor>(Tensor::Empty(DType::kF32, s).value());
      for (int64_t i = 0; i < t->numel(); ++i) t->data_as<float>()[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
      return t;
    };
    Value* x = g.AddInput("x", DType::kF32, {8, 32}).value();
    Value* r = g.AddInput("r", DType::kF32, c.r_shape).value();
    Value* p = g.AddNode("MatMul", {x, g.AddConstant("w", filled({32, 64})).value()}, {}, "mm").value()->output();
    Value* b = g.AddConstant("b", filled({64})).value();
    Value* s1 = g.AddNode("Add", {p, c.residual_first ? r : b}, {}, "add1").value()->output();
    Value* y = g.AddNode("Add", {c.residual_first ? b : r, s1}, {}, "add2").value()->output();
    ASSERT_TRUE(g.MarkOutput(y).ok());
    ASSERT_TRUE(RunPipeline(g, cuda::DefaultCudaTarget()).ok());
    const Node* n = Only(g, "FusedGemm");
    ASSERT_NE(n, nullptr) << PrintGraph(g);
    const CublasLtEpilogue e = CublasLtEpilogueFor(*n);
    if (!c.covered) {
      EXPECT_EQ(e.kind, CublasLtEpilogue::kNotCovered) << PrintGraph(g);
      continue;
    }
    ASSERT_EQ(e.kind, CublasLtEpilogue::kBias) << PrintGraph(g);
    EXPECT_EQ(n->input(static_cast<size_t>(e.bias_input))->shape(), Shape({64}));
    EXPECT_EQ(n->input(static_cast<size_t>(e.residual_input))->shape(), Shape({8, 64}));
    auto plan = PlanNodeForCuda(*n);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan->path, CudaPath::kCublas);
    EXPECT_TRUE(plan->kernels.empty());
  }
}

// x @ w + b, then `act` (none, Relu, GeluTanh), all in f16 or bf16 (the bias in the GEMM's
// dtype, which is cuBLASLt's bias type for such outputs): cuBLASLt's BIAS / RELU_BIAS /
// GELU_BIAS epilogue on a GPU, as in f32. The emulated plan takes the generated epilogue (and
// says that a GPU runs cuBLASLt's) and matches a float64 reference within four units of the
// dtype; with a GPU, the cuBLASLt call's outputs match the emulated plan's within two (the
// emulation rounds the product before the bias, cuBLASLt does not; GELU's tanh may round apart).
TEST(CudaCodegen, NarrowBiasEpiloguesGoToCublasLt) {
  std::string why;
  const bool gpu = CudaDeviceAvailable(0, &why);
  for (DType dt : {DType::kF16, DType::kBF16}) {
    for (const char* act : {"", "Relu", "GeluTanh"}) {
      SCOPED_TRACE(StrCat(DTypeName(dt), " act '", act, "'"));
      Graph g("narrow_gemm");
      std::mt19937 rng(5);
      std::uniform_real_distribution<float> u(-1, 1);
      auto filled = [&](const Shape& s) {
        Tensor t = Tensor::Empty(DType::kF32, s).value();
        for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = u(rng);
        return std::make_shared<Tensor>(ConvertedTo(t, dt));
      };
      Value* x = g.AddInput("x", dt, {8, 32}).value();
      Value* p = g.AddNode("MatMul", {x, g.AddConstant("w", filled({32, 64})).value()}, {}, "mm").value()->output();
      Value* y = g.AddNode("Add", {p, g.AddConstant("b", filled({64})).value()}, {}, "add").value()->output();
      if (*act) y = g.AddNode(act, {y}, {}, "act").value()->output();
      ASSERT_TRUE(g.MarkOutput(y).ok());
      ASSERT_TRUE(RunPipeline(g, cuda::DefaultCudaTarget()).ok());
      const Node* n = Only(g, "FusedGemm");
      ASSERT_NE(n, nullptr) << PrintGraph(g);
      const CublasLtEpilogue e = CublasLtEpilogueFor(*n);
      const CublasLtEpilogue::Kind want = !*act                       ? CublasLtEpilogue::kBias
                                          : std::string(act) == "Relu" ? CublasLtEpilogue::kReluBias
                                                                       : CublasLtEpilogue::kGeluTanhBias;
      EXPECT_EQ(e.kind, want) << PrintGraph(g);
      EXPECT_EQ(e.bias_input, 2);
      auto plan = PlanNodeForCuda(*n);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      EXPECT_EQ(plan->path, CudaPath::kCublas);
      std::shared_ptr<Tensor> xin = filled({8, 32});
      const std::vector<TensorView> views = {xin->view()};
      // The CPU's GEMMs are f32 only: a float64 reference on the same dt values.
      const Tensor& wt = *n->input(1)->constant();
      const Tensor& bt = *n->input(2)->constant();
      Tensor ref = Tensor::Empty(DType::kF32, {8, 64}).value();
      for (int64_t i = 0; i < 8; ++i)
        for (int64_t j = 0; j < 64; ++j) {
          double v = bt.GetAsDouble(j);
          for (int64_t q = 0; q < 32; ++q) v += xin->GetAsDouble(i * 32 + q) * wt.GetAsDouble(q * 64 + j);
          if (std::string(act) == "Relu") v = std::max(v, 0.0);
          if (std::string(act) == "GeluTanh")
            v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
          ref.data_as<float>()[i * 64 + j] = static_cast<float>(v);
        }
      CudaExecOptions o;
      o.emulate = true;
      auto emu = CudaExecutor::Create(g, o);
      ASSERT_TRUE(emu.ok()) << emu.status().ToString();
      EXPECT_NE((*emu)->describe().back().find("GEMM, then the generated epilogue (cuBLASLt's epilogue on a GPU)"),
                std::string::npos)
          << (*emu)->describe().back();
      auto emulated = (*emu)->Run(views);
      ASSERT_TRUE(emulated.ok()) << emulated.status().ToString();
      const double unit = dt == DType::kBF16 ? 0x1p-8 : 0x1p-11;
      auto expect_close = [&](const Tensor& got, const Tensor& ref, double units, const char* what) {
        for (int64_t i = 0; i < ref.numel(); ++i)
          ASSERT_LE(std::fabs(got.GetAsDouble(i) - ref.GetAsDouble(i)), units * unit * (1 + std::fabs(ref.GetAsDouble(i))))
              << what << " element " << i;
      };
      expect_close((*emulated)[0], ref, 4, "emulated vs float64");  // the product rounded, then the output
      if (!gpu) continue;
      CudaExecOptions go;
      go.kernel_cache_dir = (std::filesystem::temp_directory_path() / "graphfuse_test_kernels").string();
      auto dev = CudaExecutor::Create(g, go);
      ASSERT_TRUE(dev.ok()) << dev.status().ToString();
      const std::string line = (*dev)->describe().back();
      // cuBLASLt may have no algorithm for a shape: then the generated epilogue, and the line says so.
      EXPECT_TRUE(line.find(StrCat("cuBLASLt GEMM in ", DTypeName(dt), " with its ")) != std::string::npos ||
                  line.find("cuBLASLt had no algorithm") != std::string::npos)
          << line;
      std::printf("[ cuda     ] %s\n", line.c_str());
      auto got = (*dev)->Run(views);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      expect_close((*got)[0], (*emulated)[0], 2, "GPU vs emulated");
    }
  }
}

// Every node of the demo presets' and the exported models' fused plans has a CUDA path, and
// every kernel they need compiles.
TEST(CudaCodegen, EveryKernelOfTheBlocksAndExportedModelsCompiles) {
  std::vector<std::pair<std::string, std::unique_ptr<Graph>>> graphs;
  ThreadPool pool(2);
  const CpuContext ctx{&pool};
  for (const char* preset : {"llama-small", "gpt2", "bert"}) {
    auto cfg = BlockPreset(preset);
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    cfg->seq = 8;
    auto w = MakeBlockWeights(*cfg, 1, ctx);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    auto g = std::make_unique<Graph>(preset);
    ASSERT_TRUE(BuildBlock(*g, *cfg, *w).ok());
    graphs.emplace_back(StrCat("demo preset ", preset), std::move(g));
  }
  const std::filesystem::path models = std::filesystem::path(GF_MODELS_DIR);
  for (const auto& entry : std::filesystem::directory_iterator(models)) {
    if (!std::filesystem::exists(entry.path() / "model.onnx")) continue;  // hf/: the corpus, one model a folder below
    auto g = ImportOnnxFile((entry.path() / "model.onnx").string());
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    graphs.emplace_back(entry.path().filename().string(), std::move(*g));
  }
  std::vector<CudaKernelSource> kernels;
  std::map<std::string, int> paths, unplanned;
  for (auto& [label, g] : graphs) {
    auto run = RunPipeline(*g, cuda::DefaultCudaTarget());
    ASSERT_TRUE(run.ok()) << label << ": " << run.status().ToString();
    // A node without a CUDA path of its own runs its reference graph there (the executor's
    // PlanReference): the projected attention runs as the QKV GEMM and the attention. Walked
    // three times: as planned at these sizes (attention in one kernel), and with every
    // attention planned as at prefill sizes, in the flash kernel and in its GEMM form.
    for (int variant : {0, 1, 2}) {
      CudaPlanOptions po;
      po.attention_rows_one_kernel = variant == 0 ? 16 : 0;
      po.prefill_attention = variant == 2 ? PrefillAttention::kGemms : PrefillAttention::kFlash;
      const Status walked = ForEachCudaPlan(
          *g,
          [&](const Node& n, Result<CudaNodePlan>& plan, int) {
            if (!plan.ok() && n.GetGraph("reference")) {
              ++paths["reference graph"];
            } else if (!plan.ok()) {
              ++unplanned[n.op()];
              ADD_FAILURE() << label << ": " << plan.status().ToString();
            } else {
              ++paths[plan->path == CudaPath::kAttentionGemms                ? "attention as GEMMs"
                      : plan->what.rfind("flash attention", 0) == 0 ? "flash attention"
                                                                     : plan->what];
              for (CudaKernelSource& k : plan->kernels) kernels.push_back(std::move(k));
            }
            return Status::Ok();
          },
          po);
      ASSERT_TRUE(walked.ok()) << walked.ToString();
    }
  }
  EXPECT_GE(kernels.size(), 20u);
  EXPECT_GT(paths["generated row kernel"], 0);
  EXPECT_GT(paths["cuBLAS GEMM, then the generated epilogue"], 0);
  EXPECT_GT(paths["generated attention kernel"], 0);
  EXPECT_GT(paths["attention as GEMMs"], 0);
  EXPECT_GT(paths["flash attention"], 0);
  NvrtcCompiler compiler;
  double seconds = 0;
  for (const std::string& f : CompileAll(kernels, compiler, &seconds)) ADD_FAILURE() << f;
  std::printf("[ cuda     ] %zu kernels of %zu fused plans compiled in %.1f s; paths:", kernels.size(), graphs.size(),
              seconds);
  for (const auto& [what, count] : paths) std::printf(" %s x%d;", what.c_str(), count);
  for (const auto& [op, count] : unplanned) std::printf(" no CUDA path yet: %s x%d;", op.c_str(), count);
  std::printf("\n");
}

// ---- the snapshot ----------------------------------------------------------------------------

TEST(CudaCodegen, GoldenSources) {
  auto check = [](const std::string& name, const CudaKernelSource& k) { ExpectGoldenSource(name, k.source); };
  // The prelude every kernel starts with, kept once.
  ExpectGoldenFile("prelude.cuh", kDevicePrelude);
  for (const char* name : {"chain", "gelu", "silu", "f16_chain", "dropout"}) {
    const FusedCase* c = nullptr;
    for (const FusedCase& fc : kFusedCases)
      if (std::string(fc.name) == name) c = &fc;
    ASSERT_NE(c, nullptr);
    auto k = FusedKernel(*c);
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    check(name, *k);
  }
  for (const char* name : {"add_rmsnorm", "scale_mask_softmax_dropout", "rope"}) {
    const RowCase* c = nullptr;
    for (const RowCase& rc : kRowCases)
      if (std::string(rc.name) == name) c = &rc;
    ASSERT_NE(c, nullptr);
    auto g = Pipelined(c->ir);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    auto k = GenerateKernelForNode(*Only(**g, c->op));
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    check(name, *k);
  }
  {  // one row kernel in bf16: the residual RMSNorm's add rounded as stored, the norm in f32
    const RowCase* c = nullptr;
    for (const RowCase& rc : kRowCases)
      if (std::string(rc.name) == "add_rmsnorm") c = &rc;
    ASSERT_NE(c, nullptr);
    auto g = Pipelined(c->ir);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    auto twin = NarrowTwin(*Only(**g, c->op), DType::kBF16);
    ASSERT_TRUE(twin.ok()) << twin.status().ToString();
    auto k = GenerateKernelForNode(*twin->node);
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    check("add_rmsnorm_bf16", *k);
  }
  {  // the exported LLaMA block's attention (RoPE, causal mask)
    const std::filesystem::path model =
        std::filesystem::path(GF_MODELS_DIR) / "llama_block_opset17" / "model.onnx";
    auto lg = ImportOnnxFile(model.string());
    ASSERT_TRUE(lg.ok()) << lg.status().ToString();
    PipelineOptions two_nodes;  // the CUDA backend runs the projected form as these two nodes
    two_nodes.fusion.attention_projection = false;
    ASSERT_TRUE(RunPipeline(**lg, cuda::DefaultCudaTarget(), two_nodes).ok());
    auto ak = GenerateKernelForNode(*Only(**lg, "FusedAttention"));
    ASSERT_TRUE(ak.ok()) << ak.status().ToString();
    check("llama_attention", *ak);
    auto gk = GenerateAttentionGemmKernels(*Only(**lg, "FusedAttention"));  // its GEMM form's kernels
    ASSERT_TRUE(gk.ok()) << gk.status().ToString();
    check("llama_attention_prep", gk->prep);
    check("llama_attention_softmax", gk->softmax);
  }
  {  // the flash kernel: 96 rows over grouped K / V heads, RoPE, a constant causal mask (key
     // tiles left out)
    const int64_t s = 96;
    std::string mask;
    for (int64_t i = 0; i < s * s; ++i) mask += StrCat(i ? ", " : "", i % s > i / s ? "-inf" : "0");
    auto fg = ParseGraph(StrCat(
        "graph @flash(%q: f32[1,4,96,64], %k: f32[1,2,96,64], %v: f32[1,2,96,64], %cos: f32[96,64], %sin: f32[96,64]) {\n",
        "  %mask: f32[1,1,96,96] = const [", mask, "]\n",
        "  %o = FusedAttention(%q, %k, %v, %mask, %cos, %sin) {batch = 1, heads = 4, kv_heads = 2, seq_q = 96, "
        "seq_k = 96, head_dim = 64, scale = 0.125, q_layout = \"bhsd\", k_layout = \"bhsd\", v_layout = \"bhsd\", "
        "out_layout = \"bshd\", output_shape = [1, 96, 256], has_mask = 1, rope_q = 1, rope_k = 1}\n",
        "  return %o\n}"));
    ASSERT_TRUE(fg.ok()) << fg.status().ToString();
    auto fk = GenerateFlashAttentionKernel(*Only(**fg, "FusedAttention"));
    ASSERT_TRUE(fk.ok()) << fk.status().ToString();
    EXPECT_NE(fk->name.find("_causal_"), std::string::npos) << fk->name;
    check("flash_attention_causal_gqa", *fk);
  }
  auto g = GemmGraph("", false, true);  // MatMul + residual Add: a generated epilogue
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto k = GenerateKernelForNode(*Only(**g, "FusedGemm"));
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  check("gemm_residual_epilogue", *k);
}

// ---- needs a GPU ---------------------------------------------------------------------------

TEST(CudaRuntime, WithoutADeviceTheExecutorSaysSo) {
  std::string why;
  if (CudaDeviceAvailable(0, &why)) GTEST_SKIP() << "a CUDA device is present";
  auto g = ParseGraph(R"(graph @g(%x: f32[4]) {
  %y = Relu(%x)
  return %y
})");
  ASSERT_TRUE(g.ok());
  auto ex = CudaExecutor::Create(**g);
  ASSERT_FALSE(ex.ok());
  EXPECT_NE(ex.status().message().find("no CUDA device"), std::string::npos) << ex.status().ToString();
}

// Needs a GPU: every graph of the corpus, unfused and fused, on the GPU (stream and CUDA graph)
// against the CPU executor on the same random inputs.
TEST(CudaRuntime, CorpusRunsOnTheGpuAsOnTheCpu) {
  std::string why;
  if (!CudaDeviceAvailable(0, &why)) GTEST_SKIP() << why << ": runtime tests need a GPU";
  ThreadPool pool(2);
  const CpuContext ctx{&pool};
  std::vector<std::pair<std::string, std::function<Result<std::unique_ptr<Graph>>()>>> sources;
  for (const char* preset : {"llama-small", "gpt2", "bert"})
    sources.push_back({preset, [preset, &ctx]() -> Result<std::unique_ptr<Graph>> {
                         GF_ASSIGN_OR_RETURN(BlockConfig cfg, BlockPreset(preset));
                         cfg.seq = 8;
                         GF_ASSIGN_OR_RETURN(BlockWeights w, MakeBlockWeights(cfg, 1, ctx));
                         auto g = std::make_unique<Graph>(preset);
                         GF_RETURN_IF_ERROR(BuildBlock(*g, cfg, w));
                         return g;
                       }});
  const std::filesystem::path models = std::filesystem::path(GF_MODELS_DIR);
  for (const auto& entry : std::filesystem::directory_iterator(models)) {
    const std::string path = (entry.path() / "model.onnx").string();
    sources.push_back({entry.path().filename().string(), [path]() { return ImportOnnxFile(path); }});
  }
  for (const auto& [label, make] : sources) {
    // Fused plans also with every attention planned as at prefill sizes (rows_one_kernel 0):
    // in its GEMM form (variant 2) and in the flash kernel (variant 3).
    for (int variant : {0, 1, 2, 3}) {
      const bool fuse = variant > 0;
      const int64_t rows_one_kernel = variant >= 2 ? 0 : 16;
      const char* form = variant == 2 ? ", attention as GEMMs" : variant == 3 ? ", flash attention" : "";
      for (bool graph : {false, true}) {
        auto g = make();
        ASSERT_TRUE(g.ok()) << label << ": " << g.status().ToString();
        PipelineOptions po;
        po.fusion.enabled = fuse;
        ASSERT_TRUE(RunPipeline(**g, cuda::DefaultCudaTarget(), po).ok()) << label;
        const std::vector<Tensor> ins = FloatInputs(**g, 3);
        const std::vector<TensorView> views = Views(ins);
        auto want = Execute(**g, views, ctx);
        ASSERT_TRUE(want.ok()) << label << ": " << want.status().ToString();
        CudaExecOptions o;
        o.cuda_graph = graph;
        o.plan.attention_rows_one_kernel = rows_one_kernel;
        o.plan.prefill_attention = variant == 2 ? PrefillAttention::kGemms : PrefillAttention::kFlash;
        o.kernel_cache_dir = (std::filesystem::temp_directory_path() / "graphfuse_test_kernels").string();
        auto ex = CudaExecutor::Create(**g, o);
        if (!ex.ok() && graph && ex.status().message().find("runs on the host") != std::string::npos) continue;
        ASSERT_TRUE(ex.ok()) << label << ": " << ex.status().ToString();
        auto got = (*ex)->Run(views);
        ASSERT_TRUE(got.ok()) << label << ": " << got.status().ToString();
        ASSERT_EQ(got->size(), want->size());
        for (size_t k = 0; k < got->size(); ++k) {
          double worst = 0;
          for (int64_t i = 0; i < (*got)[k].numel(); ++i) {
            const double a = (*got)[k].GetAsDouble(i), b = (*want)[k].GetAsDouble(i);
            const double err = std::fabs(a - b) / (1e-4 + 1e-3 * std::fabs(b));
            worst = std::max(worst, std::isnan(err) ? 1e9 : err);
          }
          EXPECT_LE(worst, 1.0) << label << (fuse ? " fused" : " unfused") << form
                                << (graph ? " (CUDA graph)" : "") << ": output " << k << " differs from the CPU's";
        }
        std::printf("[ cuda     ] %s %s%s%s: %lld launches (%lld generated, %lld cuBLAS, %lld host)\n", label.c_str(),
                    fuse ? "fused" : "unfused", form, graph ? " + CUDA graph" : "",
                    static_cast<long long>((*ex)->stats().launches), static_cast<long long>((*ex)->stats().generated),
                    static_cast<long long>((*ex)->stats().cublas), static_cast<long long>((*ex)->stats().host_fallbacks));
      }
    }
  }
}

}  // namespace
}  // namespace graphfuse::cuda
