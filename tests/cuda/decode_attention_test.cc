// FusedCachedAttention's decode kernels (src/cuda/codegen_decode.cc): the split and combine
// kernels compiled through NVRTC (decode shapes up to 16k keys), run on the host (host
// emulation) against the CPU kernel and a float64 reference on a grid of small shapes (batch,
// MHA and grouped K / V heads, head_dim, past lengths, one and two new rows), their split
// choice, and the exported KV-cache LLaMA models through the emulated CUDA executor against
// the CPU target and torch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../graph_test_util.h"
#include "capture_node.h"
#include "golden.h"
#include "narrow_twin.h"
#include "../onnx/onnx_test_util.h"
#include "cpu/executor.h"
#include "cuda/codegen.h"
#include "cuda/cuda_executor.h"
#include "cuda/cuda_target.h"
#include "cuda/host_emulation.h"
#include "cuda/nvrtc_compile.h"
#include "graphfuse/model.h"
#include "ir/text.h"
#include "passes/convert_precision.h"
#include "passes/pipeline.h"

namespace graphfuse::cuda {
namespace {

using testing::Comparison;
using testing::CompareTensors;
using testing::DataSets;
using testing::NumberedFiles;
using testing::ReadDataSetInputs;
using testing::Tolerance;

struct DecodeSpec {
  int64_t b = 1, h = 4, kv = 4, past = 7, s = 1, d = 16;
  bool rope = true;
  bool inf_mask = false;  // masked keys get -inf (else the lowest float, as transformers exports)
  // The mask per batch entry [B,1,S,Sk], batch 0's first row masked at every key (-inf), and
  // the softmax followed by the guard Where(IsNaN(P), 0, P), which zeroes that row.
  bool guarded_dead_row = false;
};

std::string Ints(std::initializer_list<int64_t> v) {
  std::string s;
  for (int64_t x : v) s += StrCat(s.empty() ? "" : ", ", x);
  return s;
}

// A decoder's attention over a KV cache as transformers exports it (as in
// tests/fuse_attention_cache_test.cc): q [B,S,H*d], k / v [B,S,KV*d] head-split, K roped, the
// past rows [B,KV,P,d] appended by Concat, K / V repeated for grouped heads, a constant causal
// mask over the P+S keys; returns the output and the present K and V rows.
std::string DecoderText(const DecodeSpec& c) {
  const int64_t sk = c.past + c.s, r = c.h / c.kv;
  std::string mask;
  const int64_t mb = c.guarded_dead_row ? c.b : 1;
  for (int64_t b = 0; b < mb; ++b)
    for (int64_t i = 0; i < c.s; ++i)
      for (int64_t j = 0; j < sk; ++j) {
        const bool dead = c.guarded_dead_row && b == 0 && i == 0;
        mask += StrCat(mask.empty() ? "" : ", ",
                       dead ? "-inf" : j > c.past + i ? (c.inf_mask ? "-inf" : "-3.40282347e+38") : "0");
      }
  std::string t = StrCat("graph @kv(%q: f32[", Ints({c.b, c.s, c.h * c.d}), "], %k: f32[", Ints({c.b, c.s, c.kv * c.d}),
                         "], %v: f32[", Ints({c.b, c.s, c.kv * c.d}), "], %past_k: f32[", Ints({c.b, c.kv, c.past, c.d}),
                         "], %past_v: f32[", Ints({c.b, c.kv, c.past, c.d}), "]");
  if (c.rope) t += StrCat(", %cos: f32[", Ints({c.b, 1, c.s, c.d}), "], %sin: f32[", Ints({c.b, 1, c.s, c.d}), "]");
  t += ") {\n";
  t += StrCat("  %qs: i64[4] = const [", Ints({c.b, c.s, c.h, c.d}), "]\n");
  t += StrCat("  %ks: i64[4] = const [", Ints({c.b, c.s, c.kv, c.d}), "]\n");
  t += StrCat("  %os: i64[3] = const [", Ints({c.b, c.s, c.h * c.d}), "]\n");
  t += StrCat("  %mask: f32[", mb, ",1,", c.s, ",", sk, "] = const [", mask, "]\n");
  if (c.guarded_dead_row) t += "  %zero: f32[] = const [0]\n";
  t += StrCat("  %c: f32[] = const [", 1.0 / std::sqrt(static_cast<double>(c.d)), "]\n");
  t += "  %qr = Reshape(%q, %qs)\n  %q4 = Transpose(%qr) {perm = [0, 2, 1, 3]}\n";
  t += "  %kr = Reshape(%k, %ks)\n  %k4 = Transpose(%kr) {perm = [0, 2, 1, 3]}\n";
  t += "  %vr = Reshape(%v, %ks)\n  %v4 = Transpose(%vr) {perm = [0, 2, 1, 3]}\n";
  std::string q = "%q4", k = "%k4";
  if (c.rope) {
    t += "  %qe = Rope(%q4, %cos, %sin)\n  %ke = Rope(%k4, %cos, %sin)\n";
    q = "%qe", k = "%ke";
  }
  t += StrCat("  %present_k = Concat(%past_k, ", k, ") {axis = -2}\n");
  t += "  %present_v = Concat(%past_v, %v4) {axis = -2}\n";
  std::string kh = "%present_k", vh = "%present_v";
  if (r > 1) {
    t += "  %ax: i64[1] = const [2]\n";
    t += StrCat("  %ex: i64[5] = const [", Ints({c.b, c.kv, r, sk, c.d}), "]\n");
    t += StrCat("  %rs: i64[4] = const [", Ints({c.b, c.h, sk, c.d}), "]\n");
    t += "  %ku = Unsqueeze(%present_k, %ax)\n  %kx = Expand(%ku, %ex)\n  %kh = Reshape(%kx, %rs)\n";
    t += "  %vu = Unsqueeze(%present_v, %ax)\n  %vx = Expand(%vu, %ex)\n  %vh = Reshape(%vx, %rs)\n";
    kh = "%kh", vh = "%vh";
  }
  t += StrCat("  %kt = Transpose(", kh, ") {perm = [0, 1, 3, 2]}\n");
  t += StrCat("  %s = MatMul(", q, ", %kt)\n  %s1 = Mul(%s, %c)\n  %s2 = Add(%s1, %mask)\n");
  t += "  %p = Softmax(%s2) {axis = -1}\n";
  if (c.guarded_dead_row) t += "  %isn = IsNaN(%p)\n  %pg = Where(%isn, %zero, %p)\n";
  t += StrCat("  %o4 = MatMul(", c.guarded_dead_row ? "%pg" : "%p", ", ", vh, ")\n");
  t += "  %ot = Transpose(%o4) {perm = [0, 2, 1, 3]}\n  %out = Reshape(%ot, %os)\n";
  t += "  return %out, %present_k, %present_v\n}";
  return t;
}

std::string Label(const DecodeSpec& c) {
  return StrCat("b", c.b, " h", c.h, " kv", c.kv, " past", c.past, " s", c.s, " d", c.d, c.rope ? "" : " no rope",
                c.inf_mask ? " -inf mask" : "", c.guarded_dead_row ? " guarded dead row" : "");
}

// The spec's graph through the CUDA target's pipeline (one FusedCachedAttention).
Result<std::unique_ptr<Graph>> DecoderGraph(const DecodeSpec& c) {
  GF_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, ParseGraph(DecoderText(c)));
  GF_RETURN_IF_ERROR(RunPipeline(*g, DefaultCudaTarget()).status());
  return g;
}

const Node* FindCached(const Graph& g) {
  for (const auto& n : g.nodes())
    if (n->op() == "FusedCachedAttention") return n.get();
  return nullptr;
}

// The node's inputs (as the CPU plan gives them) and the CPU kernel's outputs, on random data.
Result<NodeRun> CaptureNode(const Graph& g, const Node& target, uint32_t seed) {
  GF_ASSIGN_OR_RETURN(NodeRun run, graphfuse::cuda::CaptureNode(g, target, RandomInputs(g, seed, 0.05, 1.5)));
  if (run.out.size() != 3) return Internal("node ", target.name(), " gave ", run.out.size(), " outputs");
  return run;
}

// The attention in float64 from the node's inputs (DecoderText's layout: q bshd, cos / sin
// [B,1,S,d], the mask [1,1,S,Sk]) over the present rows `pk` / `pv` [B,KV,Sk,d]: [B,S,H*d].
std::vector<double> Float64Attention(const DecodeSpec& c, const NodeRun& run, const Tensor& pk, const Tensor& pv) {
  const int64_t sk = c.past + c.s, g = c.h / c.kv, half = c.d / 2;
  const float* q = run.in[0].data_as<float>();
  const float* mask = run.in[5].data_as<float>();
  const float* cs = c.rope ? run.in[6].data_as<float>() : nullptr;
  const float* sn = c.rope ? run.in[7].data_as<float>() : nullptr;
  const float* kp = pk.data_as<float>();
  const float* vp = pv.data_as<float>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  std::vector<double> out(static_cast<size_t>(c.b * c.s * c.h * c.d));
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.h; ++h)
      for (int64_t r = 0; r < c.s; ++r) {
        const float* qr = q + (b * c.s + r) * c.h * c.d + h * c.d;
        std::vector<double> qe(static_cast<size_t>(c.d));
        for (int64_t i = 0; i < c.d; ++i) {
          if (!cs) {
            qe[i] = qr[i];
            continue;
          }
          const int64_t co = (b * c.s + r) * c.d + i;
          const double x2 = i < half ? -static_cast<double>(qr[i + half]) : qr[i - half];
          qe[i] = qr[i] * static_cast<double>(cs[co]) + x2 * sn[co];
        }
        const int64_t kh = h / g;
        std::vector<double> sc(static_cast<size_t>(sk));
        double m = -INFINITY;
        for (int64_t j = 0; j < sk; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < c.d; ++i) dot += qe[i] * kp[((b * c.kv + kh) * sk + j) * c.d + i];
          sc[j] = scale * dot + mask[((c.guarded_dead_row ? b * c.s : 0) + r) * sk + j];
          m = std::max(m, sc[j]);
        }
        double sum = 0;
        if (m == -INFINITY && c.guarded_dead_row) {  // the guard: a row masked everywhere is 0
          for (int64_t i = 0; i < c.d; ++i) out[static_cast<size_t>((b * c.s + r) * c.h * c.d + h * c.d + i)] = 0;
          continue;
        }
        for (double& x : sc) sum += (x = std::exp(x - m));
        for (int64_t i = 0; i < c.d; ++i) {
          double o = 0;
          for (int64_t j = 0; j < sk; ++j) o += sc[j] * vp[((b * c.kv + kh) * sk + j) * c.d + i];
          out[static_cast<size_t>((b * c.s + r) * c.h * c.d + h * c.d + i)] = o / sum;
        }
      }
  return out;
}

// max |got - want| / (1 + |want|), NaN counting as infinite.
double WorstRelative(const Tensor& got, const std::vector<double>& want) {
  double worst = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double e = std::fabs(got.GetAsDouble(i) - want[static_cast<size_t>(i)]) / (1 + std::fabs(want[static_cast<size_t>(i)]));
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst;
}
double WorstRelative(const Tensor& got, const Tensor& want) {
  std::vector<double> w(static_cast<size_t>(want.numel()));
  for (int64_t i = 0; i < want.numel(); ++i) w[static_cast<size_t>(i)] = want.GetAsDouble(i);
  return WorstRelative(got, w);
}

// Runs decode kernels `k` on the host on `in` (fewer blocks than items: the grid-stride loops
// take the rest), into tensors shaped as `like` (output, present K, present V) in dtype dt. The
// one-launch form runs twice, and must leave its tickets zeroed after each run.
Result<std::vector<Tensor>> EmulateDecode(const DecodeAttentionKernels& k, std::vector<Tensor>& in,
                                          const std::vector<Tensor>& like, DType dt) {
  GF_ASSIGN_OR_RETURN(auto split, HostKernel::Build(k.split));
  std::vector<Tensor> got;
  for (const Tensor& t : like) got.push_back(Tensor::Empty(dt, t.shape()).value());
  std::vector<float> part(static_cast<size_t>(k.partial_elements), NAN);
  std::vector<void*> args;
  for (Tensor& t : in) args.push_back(t.data());
  args.insert(args.end(), {got[1].data(), got[2].data(), part.data()});
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(k.split.scalar_work_items, 3));
  if (k.tickets > 0) {
    std::vector<int> tickets(static_cast<size_t>(k.tickets), 0);
    args.insert(args.end(), {tickets.data(), got[0].data()});
    for (int run = 0; run < 2; ++run) {
      if (run == 1) std::memset(got[0].data(), 0xff, got[0].nbytes());  // NaNs: the second run must write it all
      split->Launch(args, k.split.sizes, grid);
      for (int t : tickets)
        if (t != 0) return Internal("run ", run, ": a ticket counter is ", t, " after the run, not 0");
    }
    return got;
  }
  GF_ASSIGN_OR_RETURN(auto combine, HostKernel::Build(k.combine));
  split->Launch(args, k.split.sizes, grid);
  combine->Launch({part.data(), got[0].data()}, k.combine.sizes, 2);
  return got;
}

// Runs the spec's decode kernels on the host (split over `opt`), as two kernels and as one
// launch, against the CPU kernel: the present rows bit for bit, the output within 1e-5 of the
// CPU's and of float64.
void CheckEmulatedDecode(const DecodeSpec& c, const DecodeSplitOptions& opt, uint32_t seed) {
  SCOPED_TRACE(Label(c));
  auto g = DecoderGraph(c);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Node* node = FindCached(**g);
  ASSERT_NE(node, nullptr) << PrintGraph(**g);
  EXPECT_EQ(node->GetInt("zero_nan_rows", 0), c.guarded_dead_row ? 1 : 0);
  auto run = CaptureNode(**g, *node, seed);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  const std::vector<double> f64 = Float64Attention(c, *run, run->out[1], run->out[2]);
  const double cpu_f64 = WorstRelative(run->out[0], f64);
  EXPECT_LT(cpu_f64, 1e-5) << "the CPU kernel against float64";
  EXPECT_GT(MaxAbs(run->out[0]), 0.01);
  for (bool one_launch : {false, true}) {
    SCOPED_TRACE(one_launch ? "one launch" : "split and combine kernels");
    DecodeSplitOptions o = opt;
    o.one_launch = one_launch;
    auto k = GenerateDecodeAttentionKernels(*node, o);
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    EXPECT_EQ(k->tickets, one_launch ? c.b * c.kv : 0);
    auto got = EmulateDecode(*k, run->in, run->out, DType::kF32);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(MaxAbsDiff((*got)[1], run->out[1]), 0.0) << "present K";
    EXPECT_EQ(MaxAbsDiff((*got)[2], run->out[2]), 0.0) << "present V";
    const double vs_cpu = WorstRelative((*got)[0], run->out[0]), vs_f64 = WorstRelative((*got)[0], f64);
    EXPECT_LT(vs_cpu, 1e-5) << "output against the CPU kernel";
    EXPECT_LT(vs_f64, 1e-5) << "output against float64";
    std::printf("[ emulated ] %s%s: %lld splits of %lld keys, %lld rows a block; err vs CPU %.2g, vs f64 %.2g\n",
                Label(c).c_str(), one_launch ? ", one launch" : "", static_cast<long long>(k->splits),
                static_cast<long long>(k->chunk), static_cast<long long>(k->rows), vs_cpu, vs_f64);
  }
}

TEST(CudaDecodeAttention, EmulatedKernelsMatchTheCpuKernel) {
  // Chunks of a few keys: several splits even at these lengths (the default options split
  // 1000 keys 32 ways, below).
  const DecodeSplitOptions small{.sms = 16, .min_keys_per_split = 3};
  const DecodeSpec specs[] = {
      {.b = 1, .h = 4, .kv = 4, .past = 0, .s = 1, .d = 16},
      {.b = 1, .h = 4, .kv = 2, .past = 1, .s = 1, .d = 16},
      {.b = 2, .h = 4, .kv = 4, .past = 7, .s = 1, .d = 16},
      {.b = 2, .h = 4, .kv = 2, .past = 7, .s = 2, .d = 64},
      {.b = 1, .h = 4, .kv = 2, .past = 100, .s = 1, .d = 64},
      {.b = 2, .h = 4, .kv = 4, .past = 100, .s = 2, .d = 16},
      {.b = 1, .h = 4, .kv = 4, .past = 1000, .s = 1, .d = 16},
      {.b = 1, .h = 4, .kv = 2, .past = 1000, .s = 2, .d = 16},
      {.b = 1, .h = 4, .kv = 2, .past = 0, .s = 2, .d = 64},
      {.b = 1, .h = 4, .kv = 4, .past = 7, .s = 1, .d = 64, .rope = false},
  };
  uint32_t seed = 40;
  for (const DecodeSpec& c : specs) CheckEmulatedDecode(c, small, seed++);
  CheckEmulatedDecode({.b = 1, .h = 4, .kv = 2, .past = 1000, .s = 1, .d = 64}, DecodeSplitOptions{}, seed++);
  // One key per split, two new rows and a -inf mask: the first row's last split is masked whole.
  CheckEmulatedDecode({.b = 1, .h = 4, .kv = 2, .past = 10, .s = 2, .d = 16, .inf_mask = true},
                      {.sms = 64, .min_keys_per_split = 1}, seed++);
  // A row masked at every key under the softmax's NaN guard (zero_nan_rows): 0, every split of
  // it masked whole, on the CPU and the emulated kernels alike.
  for (const int64_t past : {int64_t{0}, int64_t{9}, int64_t{100}})
    CheckEmulatedDecode({.b = 2, .h = 4, .kv = 2, .past = past, .s = 2, .d = 16, .guarded_dead_row = true},
                        {.sms = 16, .min_keys_per_split = 3}, seed++);
}

// The spec's decode step computed in dt (f16 / bf16): the f32 graph converted with its inputs and
// outputs in dt, through the CUDA target's pipeline.
Result<std::unique_ptr<Graph>> NarrowDecoderGraph(const DecodeSpec& c, DType dt) {
  GF_ASSIGN_OR_RETURN(std::unique_ptr<Graph> f32, ParseGraph(DecoderText(c)));
  GF_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, ConvertPrecision(*f32, dt, {.narrow_io = true}));
  GF_RETURN_IF_ERROR(RunPipeline(*g, DefaultCudaTarget()).status());
  return g;
}

// v rounded to dt (nearest even), as f32 and as dt's bits.
float RoundF32(float v, DType dt) {
  return dt == DType::kBF16 ? BF16BitsToF32(F32ToBF16Bits(v)) : F16BitsToF32(F32ToF16Bits(v));
}

// The decode kernels in f16 / bf16 (K / V caches, q, masks and tables in that dtype), against
// the f32 kernels on the same rounded inputs: the present K rows are the f32 kernel's rounded to
// dt (bit for bit), the present V rows the inputs; the output within dt's rounding of float64
// over those present rows.
TEST(CudaDecodeAttention, EmulatedInF16AndBf16MatchesF32OnRoundedInputs) {
  const DecodeSplitOptions small{.sms = 16, .min_keys_per_split = 3};
  const DecodeSpec specs[] = {{.b = 1, .h = 4, .kv = 2, .past = 100, .s = 1, .d = 64},
                              {.b = 2, .h = 4, .kv = 4, .past = 7, .s = 2, .d = 16}};
  uint32_t seed = 70;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (const DecodeSpec& c : specs) {
      SCOPED_TRACE(StrCat(DTypeName(dt), " ", Label(c)));
      auto g32 = DecoderGraph(c);
      ASSERT_TRUE(g32.ok()) << g32.status().ToString();
      auto gn = NarrowDecoderGraph(c, dt);
      ASSERT_TRUE(gn.ok()) << gn.status().ToString();
      const Node* n32 = FindCached(**g32);
      const Node* nn = FindCached(**gn);
      ASSERT_TRUE(n32 && nn) << PrintGraph(**gn);
      ASSERT_EQ(nn->inputs().size(), n32->inputs().size());
      for (const Value* o : nn->outputs()) EXPECT_EQ(o->dtype(), dt);
      auto k32 = GenerateDecodeAttentionKernels(*n32, small);
      auto kn = GenerateDecodeAttentionKernels(*nn, small);
      ASSERT_TRUE(k32.ok() && kn.ok()) << kn.status().ToString();
      EXPECT_NE(kn->split.name.find(DTypeName(dt)), std::string::npos) << kn->split.name;
      for (const CudaKernelSource* k : {&kn->split, &kn->combine}) {
        auto compiled = NvrtcCompiler().Compile(*k);
        EXPECT_TRUE(compiled.ok()) << compiled.status().ToString();
      }
      auto run = CaptureNode(**g32, *n32, seed++);
      ASSERT_TRUE(run.ok()) << run.status().ToString();
      // The f32 node's inputs rounded to dt, and the same values stored in dt.
      std::vector<Tensor> narrow_in;
      for (Tensor& t : run->in) {
        for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = RoundF32(t.data_as<float>()[i], dt);
        narrow_in.push_back(ConvertedTo(t, dt));
      }
      auto want = EmulateDecode(*k32, run->in, run->out, DType::kF32);
      ASSERT_TRUE(want.ok()) << want.status().ToString();
      auto got = EmulateDecode(*kn, narrow_in, run->out, dt);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      for (int o : {1, 2}) {
        int64_t diff = 0;
        for (int64_t i = 0; i < (*got)[o].numel(); ++i)
          diff += (*got)[o].GetAsDouble(i) != RoundF32((*want)[o].data_as<float>()[i], dt);
        EXPECT_EQ(diff, 0) << (o == 1 ? "present K" : "present V");
      }
      // float64 over the present rows the narrow kernel keeps.
      Tensor pk = Tensor::Empty(DType::kF32, (*got)[1].shape()).value();
      Tensor pv = Tensor::Empty(DType::kF32, (*got)[2].shape()).value();
      for (int64_t i = 0; i < pk.numel(); ++i) pk.data_as<float>()[i] = static_cast<float>((*got)[1].GetAsDouble(i));
      for (int64_t i = 0; i < pv.numel(); ++i) pv.data_as<float>()[i] = static_cast<float>((*got)[2].GetAsDouble(i));
      const std::vector<double> f64 = Float64Attention(c, *run, pk, pv);
      const double err = WorstRelative((*got)[0], f64);
      // One rounding of the output (2^-9 of bf16, 2^-12 of f16) over f32 sums.
      EXPECT_LT(err, dt == DType::kBF16 ? 4e-3 : 5e-4) << "output against float64";
      EXPECT_GT(MaxAbs((*got)[0]), 0.01);
      std::printf("[ emulated ] %s %s: err vs f64 %.2g\n", DTypeName(dt), Label(c).c_str(), err);
    }
  }
}

// The split choice: at batch 1 every multiprocessor gets a block (for long enough caches), a
// chunk never exceeds what the scores' shared memory holds, and every key lies in one split.
TEST(CudaDecodeAttention, SplitsFillTheMultiprocessors) {
  struct Case {
    DecodeSpec spec;
    int sms;
  } cases[] = {{{.b = 1, .h = 32, .kv = 8, .past = 8191, .s = 1, .d = 128}, 132},
               {{.b = 1, .h = 32, .kv = 32, .past = 8191, .s = 1, .d = 128}, 132},
               {{.b = 1, .h = 8, .kv = 8, .past = 16383, .s = 1, .d = 64}, 132},
               {{.b = 1, .h = 8, .kv = 2, .past = 4095, .s = 2, .d = 128}, 108},
               {{.b = 4, .h = 8, .kv = 8, .past = 999, .s = 1, .d = 64}, 132}};
  for (const Case& c : cases) {
    SCOPED_TRACE(Label(c.spec));
    auto g = DecoderGraph(c.spec);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    const Node* node = FindCached(**g);
    ASSERT_NE(node, nullptr);
    auto k = GenerateDecodeAttentionKernels(*node, {.sms = c.sms});
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    const int64_t sk = c.spec.past + c.spec.s, heads = c.spec.b * c.spec.kv;
    EXPECT_GE(heads * k->splits, c.sms);
    EXPECT_LE(k->chunk, 512);
    EXPECT_GE(k->chunk * k->splits, sk);
    EXPECT_LT(k->chunk * (k->splits - 1), sk);
    EXPECT_EQ(k->rows, c.spec.h / c.spec.kv * c.spec.s);
  }
}

// The kernels of decode shapes up to 16k keys compile through NVRTC, and the registry plans the
// node as them (with more query rows than a decode step, the node keeps its reference graph).
TEST(CudaDecodeAttention, KernelsCompileThroughNvrtc) {
  const DecodeSpec specs[] = {{.b = 1, .h = 32, .kv = 8, .past = 8191, .s = 1, .d = 128},
                              {.b = 2, .h = 32, .kv = 32, .past = 16383, .s = 1, .d = 128},
                              {.b = 1, .h = 4, .kv = 2, .past = 7, .s = 2, .d = 64},
                              {.b = 1, .h = 4, .kv = 4, .past = 0, .s = 1, .d = 16, .rope = false}};
  NvrtcCompiler compiler;
  for (const DecodeSpec& c : specs) {
    SCOPED_TRACE(Label(c));
    auto g = DecoderGraph(c);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    const Node* node = FindCached(**g);
    ASSERT_NE(node, nullptr);
    auto plan = PlanNodeForCuda(*node);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan->path, CudaPath::kDecodeAttention);
    ASSERT_EQ(plan->kernels.size(), 1u) << "one launch: the last split combines";
    CudaPlanOptions two;
    two.decode.one_launch = false;
    auto two_plan = PlanNodeForCuda(*node, two);
    ASSERT_TRUE(two_plan.ok()) << two_plan.status().ToString();
    ASSERT_EQ(two_plan->kernels.size(), 2u);
    std::vector<CudaKernelSource> all = plan->kernels;
    all.insert(all.end(), two_plan->kernels.begin(), two_plan->kernels.end());
    for (const CudaKernelSource& k : all) {
      auto compiled = compiler.Compile(k);
      ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
      EXPECT_NE(compiled->image.find(k.name), std::string::npos) << k.name;
    }
    CudaPlanOptions prefill;
    prefill.attention_rows_one_kernel = c.s - 1;
    EXPECT_FALSE(PlanNodeForCuda(*node, prefill).ok()) << "more query rows than a decode step: the reference graph";
  }
}

// The kernels' sources for a grouped-query decode step (RoPE, causal mask, 1000 past keys), as
// two kernels and as one launch, against tests/golden (GF_UPDATE_GOLDEN=1 rewrites them, as CudaCodegen.GoldenSources).
TEST(CudaDecodeAttention, GoldenSources) {
  auto g = DecoderGraph({.b = 1, .h = 8, .kv = 2, .past = 1000, .s = 1, .d = 64});
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const Node* node = FindCached(**g);
  ASSERT_NE(node, nullptr);
  auto k = GenerateDecodeAttentionKernels(*node, {.one_launch = false});
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  auto one = GenerateDecodeAttentionKernels(*node);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  for (const auto& [name, src] : {std::pair<std::string, const CudaKernelSource*>{"decode_attention_split", &k->split},
                                  {"decode_attention_combine", &k->combine},
                                  {"decode_attention_one_launch", &one->split}}) {
    ExpectGoldenSource(name, src->source);
  }
}

// The exported KV-cache LLaMA models (MHA and grouped-query) through the CUDA executor in
// emulation, decode kernels included: against the CPU target on the same plan's inputs, and
// against torch's outputs.
TEST(CudaDecodeAttention, ExportedKvCacheModelsMatchTheCpu) {
  const std::filesystem::path corpus = std::filesystem::path(GF_MODELS_DIR) / "hf";
  auto cuda_target = MakeTarget("cuda", {.cuda = {.emulate = true}});
  ASSERT_TRUE(cuda_target.ok()) << cuda_target.status().ToString();
  auto cpu_target = MakeTarget("cpu", {.cpu = {.threads = 2}});
  ASSERT_TRUE(cpu_target.ok()) << cpu_target.status().ToString();
  const std::shared_ptr<const Target> cuda = std::move(*cuda_target), cpu = std::move(*cpu_target);
  for (const char* name : {"llama_ts_kv", "llama_gqa_ts_kv"}) {
    SCOPED_TRACE(name);
    const std::string dir = (corpus / name).string();
    auto on_cuda = CompiledModel::Compile(Model::FromOnnxFile(dir + "/model.onnx").value(), cuda);
    ASSERT_TRUE(on_cuda.ok()) << on_cuda.status().ToString();
    auto on_cpu = CompiledModel::Compile(Model::FromOnnxFile(dir + "/model.onnx").value(), cpu);
    ASSERT_TRUE(on_cpu.ok()) << on_cpu.status().ToString();
    std::vector<std::string> names;
    for (const TensorInfo& t : (*on_cuda)->inputs()) names.push_back(t.name);
    const std::string set = DataSets(dir).at(0);
    auto inputs = ReadDataSetInputs(set, names);
    ASSERT_TRUE(inputs.ok()) << inputs.status().ToString();
    const std::vector<TensorView> views = Views(*inputs);
    auto plan = (*on_cuda)->PlanFor(views);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    int decode_nodes = 0;
    for (const auto& n : (*plan)->graph().nodes())
      if (n->op() == "FusedCachedAttention") {
        auto p = PlanNodeForCuda(*n);
        ASSERT_TRUE(p.ok()) << p.status().ToString();
        EXPECT_EQ(p->path, CudaPath::kDecodeAttention) << n->Describe();
        ++decode_nodes;
      }
    EXPECT_GT(decode_nodes, 0) << "the model's attention runs as the decode kernels";
    auto got = (*on_cuda)->Run(views);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    auto want = (*on_cpu)->Run(views);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    const auto refs = NumberedFiles(set, "output_");
    ASSERT_EQ(got->size(), want->size());
    ASSERT_EQ(refs.size(), got->size());
    for (size_t o = 0; o < got->size(); ++o) {
      const double vs_cpu = WorstRelative((*got)[o], (*want)[o]);
      EXPECT_LT(vs_cpu, 1e-5) << "output " << o << " against the CPU target";
      auto ref = ReadTensorProtoFile(refs[o]);
      ASSERT_TRUE(ref.ok());
      const Comparison cmp = CompareTensors((*got)[o], *ref, Tolerance{1e-3, 1e-4});
      EXPECT_TRUE(cmp.ok) << "output " << o << " against torch: " << cmp.detail;
      std::printf("[ emulated ] %s output %zu %s: err vs CPU %.2g\n", name, o, ShapeToString((*got)[o].shape()).c_str(),
                  vs_cpu);
    }
  }
}

}  // namespace
}  // namespace graphfuse::cuda
