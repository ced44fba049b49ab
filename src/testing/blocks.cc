#include "core/hash.h"
#include "testing/blocks.h"

#include <cmath>

#include "graphfuse/thread_pool.h"

namespace graphfuse {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A 64-bit FNV-1a variant with its own (historical) basis: the seeds it gives fix the blocks' weights.
uint64_t NameHash(const std::string& s) { return Fnv1a64(s, 1469598103934665603ull); }

struct Spec {
  std::string name;
  Shape shape;
  enum Kind { kUniform, kOnes, kZeros, kCos, kSin, kCausal, kPadding } kind = kUniform;
  double scale = 1.0;
};

std::vector<Spec> WeightSpecs(const BlockConfig& c) {
  const int64_t d = c.hidden, f = c.ffn, hd = c.head_dim(), s = c.seq;
  const double in_d = 1 / std::sqrt(static_cast<double>(d)), in_f = 1 / std::sqrt(static_cast<double>(f));
  std::vector<Spec> w;
  const bool bias = c.family != BlockFamily::kLlama;
  auto proj = [&](const std::string& name, int64_t in, int64_t out, double scale) {
    w.push_back({name + ".weight", {in, out}, Spec::kUniform, scale});
    if (bias) w.push_back({name + ".bias", {out}, Spec::kUniform, 0.1});
  };
  auto norm = [&](const std::string& name) {
    w.push_back({name + ".weight", {d}, Spec::kUniform, 0.2});  // around 1: see Fill
    if (c.family != BlockFamily::kLlama) w.push_back({name + ".bias", {d}, Spec::kUniform, 0.1});
  };
  norm("input_norm");
  proj("q_proj", d, d, in_d);
  proj("k_proj", d, d, in_d);
  proj("v_proj", d, d, in_d);
  proj("o_proj", d, d, in_d);
  norm("post_norm");
  if (c.family == BlockFamily::kLlama) {
    proj("gate_proj", d, f, in_d);
    proj("up_proj", d, f, in_d);
    proj("down_proj", f, d, in_f);
    w.push_back({"rope.cos", {s, hd}, Spec::kCos});
    w.push_back({"rope.sin", {s, hd}, Spec::kSin});
  } else {
    proj("fc_in", d, f, in_d);
    proj("fc_out", f, d, in_f);
  }
  if (c.family == BlockFamily::kBert) w.push_back({"attention.mask", {c.batch, 1, 1, s}, Spec::kPadding});
  else w.push_back({"attention.mask", {s, c.past + s}, Spec::kCausal});
  return w;
}

// Large negative instead of -inf: a fully masked row stays finite.
constexpr float kMasked = -1e9f;

void Fill(const Spec& sp, const BlockConfig& c, uint32_t seed, float* p, int64_t begin, int64_t end) {
  const uint64_t key = NameHash(sp.name) ^ (static_cast<uint64_t>(seed) << 32);
  const int64_t hd = c.head_dim();
  for (int64_t i = begin; i < end; ++i) {
    switch (sp.kind) {
      case Spec::kUniform: {
        const double u = static_cast<double>(SplitMix(key + static_cast<uint64_t>(i)) >> 11) * 0x1.0p-53 * 2 - 1;
        const bool norm_scale = sp.name.find("norm.weight") != std::string::npos;
        p[i] = static_cast<float>(norm_scale ? 1 + u * sp.scale : u * sp.scale);
        break;
      }
      case Spec::kOnes: p[i] = 1; break;
      case Spec::kZeros: p[i] = 0; break;
      case Spec::kCos:
      case Spec::kSin: {
        const int64_t pos = c.past + i / hd, j = i % hd % (hd / 2);
        const double angle = static_cast<double>(pos) * std::pow(10000.0, -2.0 * static_cast<double>(j) / hd);
        p[i] = static_cast<float>(sp.kind == Spec::kCos ? std::cos(angle) : std::sin(angle));
        break;
      }
      case Spec::kCausal: {  // [seq, past + seq]: row i sees keys up to past + i
        const int64_t keys = c.past + c.seq;
        p[i] = (i % keys) <= c.past + i / keys ? 0.f : kMasked;
        break;
      }
      case Spec::kPadding: p[i] = (i % c.seq) < c.seq - c.seq / 8 ? 0.f : kMasked; break;  // last 1/8 padded
    }
  }
}

std::shared_ptr<Tensor> IntsTensor(const std::vector<int64_t>& v) {
  auto t = std::make_shared<Tensor>(Tensor::Empty(DType::kI64, {static_cast<int64_t>(v.size())}).value());
  for (size_t i = 0; i < v.size(); ++i) t->data_as<int64_t>()[i] = v[i];
  return t;
}

std::shared_ptr<Tensor> ScalarTensor(float v) {
  auto t = std::make_shared<Tensor>(Tensor::Empty(DType::kF32, {}).value());
  t->data_as<float>()[0] = v;
  return t;
}

// The builder: small helpers over Graph::AddNode that name nodes like an exported model.
class BlockBuilder {
 public:
  BlockBuilder(Graph& g, const BlockConfig& c, const BlockWeights& w) : g_(g), c_(c), w_(w) {}

  Result<Value*> W(const std::string& name) {
    if (Value* v = g_.FindValue(name)) return v;
    auto t = w_.Get(name);
    if (!t) return Internal("block weights lack '", name, "'");
    return g_.AddConstant(name, t);
  }
  Result<Value*> Const(const std::string& name, std::shared_ptr<Tensor> t) {
    if (Value* v = g_.FindValue(name)) return v;
    return g_.AddConstant(name, std::move(t));
  }
  Result<Value*> Op(const std::string& op, const std::vector<Value*>& in, const std::string& name,
                    AttributeMap attrs = {}) {
    GF_ASSIGN_OR_RETURN(Node * n, g_.AddNode(op, in, std::move(attrs), name));
    return n->output();
  }
  // x @ W (+ b)
  Result<Value*> Linear(Value* x, const std::string& name) {
    GF_ASSIGN_OR_RETURN(Value * w, W(name + ".weight"));
    GF_ASSIGN_OR_RETURN(Value * y, Op("MatMul", {x, w}, "/" + name + "/MatMul"));
    if (c_.family == BlockFamily::kLlama) return y;
    GF_ASSIGN_OR_RETURN(Value * b, W(name + ".bias"));
    return Op("Add", {y, b}, "/" + name + "/Add");
  }
  Result<Value*> Norm(Value* x, const std::string& name) {
    GF_ASSIGN_OR_RETURN(Value * scale, W(name + ".weight"));
    if (c_.family == BlockFamily::kLlama)
      return Op("RMSNorm", {x, scale}, "/" + name + "/RMSNorm", {{"epsilon", c_.eps}});
    GF_ASSIGN_OR_RETURN(Value * bias, W(name + ".bias"));
    return Op("LayerNormalization", {x, scale, bias}, "/" + name + "/LayerNormalization",
              {{"epsilon", c_.eps}, {"axis", int64_t{-1}}});
  }
  // [B, S, D] -> [B, H, S, hd]
  Result<Value*> Heads(Value* x, const std::string& name) {
    GF_ASSIGN_OR_RETURN(Value * shape, Const("shape.heads", IntsTensor({c_.batch, c_.seq, c_.heads, c_.head_dim()})));
    GF_ASSIGN_OR_RETURN(Value * r, Op("Reshape", {x, shape}, "/" + name + "/Reshape"));
    return Op("Transpose", {r}, "/" + name + "/Transpose", {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  }

  Result<Value*> Attention(Value* h) {
    GF_ASSIGN_OR_RETURN(Value * q, Linear(h, "q_proj"));
    GF_ASSIGN_OR_RETURN(Value * k, Linear(h, "k_proj"));
    GF_ASSIGN_OR_RETURN(Value * v, Linear(h, "v_proj"));
    GF_ASSIGN_OR_RETURN(Value * q4, Heads(q, "attn/q"));
    GF_ASSIGN_OR_RETURN(Value * k4, Heads(k, "attn/k"));
    GF_ASSIGN_OR_RETURN(Value * v4, Heads(v, "attn/v"));
    if (c_.family == BlockFamily::kLlama) {
      GF_ASSIGN_OR_RETURN(Value * cos, W("rope.cos"));
      GF_ASSIGN_OR_RETURN(Value * sin, W("rope.sin"));
      GF_ASSIGN_OR_RETURN(q4, Op("Rope", {q4, cos, sin}, "/attn/q/Rope"));
      GF_ASSIGN_OR_RETURN(k4, Op("Rope", {k4, cos, sin}, "/attn/k/Rope"));
    }
    if (c_.past > 0) {  // the KV cache: past rows, then the new ones
      const Shape cache = {c_.batch, c_.heads, c_.past, c_.head_dim()};
      GF_ASSIGN_OR_RETURN(Value * past_k, g_.AddInput("past_key", DType::kF32, cache));
      GF_ASSIGN_OR_RETURN(Value * past_v, g_.AddInput("past_value", DType::kF32, cache));
      GF_ASSIGN_OR_RETURN(k4, Op("Concat", {past_k, k4}, "/attn/k/Concat", {{"axis", int64_t{-2}}}));
      GF_ASSIGN_OR_RETURN(v4, Op("Concat", {past_v, v4}, "/attn/v/Concat", {{"axis", int64_t{-2}}}));
      present_k_ = k4, present_v_ = v4;
    }
    GF_ASSIGN_OR_RETURN(Value * kt, Op("Transpose", {k4}, "/attn/k/Transpose_T", {{"perm", std::vector<int64_t>{0, 1, 3, 2}}}));
    GF_ASSIGN_OR_RETURN(Value * s, Op("MatMul", {q4, kt}, "/attn/scores/MatMul"));
    const float scale = static_cast<float>(1 / std::sqrt(static_cast<double>(c_.head_dim())));
    if (c_.family == BlockFamily::kLlama) {
      GF_ASSIGN_OR_RETURN(Value * sc, Const("attention.scale", ScalarTensor(scale)));
      GF_ASSIGN_OR_RETURN(s, Op("Mul", {s, sc}, "/attn/scores/Mul"));
    } else {
      GF_ASSIGN_OR_RETURN(Value * sc, Const("attention.sqrt_dk", ScalarTensor(std::sqrt(static_cast<float>(c_.head_dim())))));
      GF_ASSIGN_OR_RETURN(s, Op("Div", {s, sc}, "/attn/scores/Div"));
    }
    GF_ASSIGN_OR_RETURN(Value * mask, W("attention.mask"));
    GF_ASSIGN_OR_RETURN(s, Op("Add", {s, mask}, "/attn/scores/Add"));
    GF_ASSIGN_OR_RETURN(Value * p, Op("Softmax", {s}, "/attn/Softmax", {{"axis", int64_t{-1}}}));
    GF_ASSIGN_OR_RETURN(Value * o4, Op("MatMul", {p, v4}, "/attn/context/MatMul"));
    GF_ASSIGN_OR_RETURN(Value * ot, Op("Transpose", {o4}, "/attn/context/Transpose", {{"perm", std::vector<int64_t>{0, 2, 1, 3}}}));
    GF_ASSIGN_OR_RETURN(Value * shape, Const("shape.hidden", IntsTensor({c_.batch, c_.seq, c_.hidden})));
    GF_ASSIGN_OR_RETURN(Value * o, Op("Reshape", {ot, shape}, "/attn/context/Reshape"));
    return Linear(o, "o_proj");
  }

  Result<Value*> Mlp(Value* h) {
    if (c_.family == BlockFamily::kLlama) {
      GF_ASSIGN_OR_RETURN(Value * gate, Linear(h, "gate_proj"));
      GF_ASSIGN_OR_RETURN(Value * up, Linear(h, "up_proj"));
      GF_ASSIGN_OR_RETURN(Value * act, Op("Silu", {gate}, "/mlp/Silu"));
      GF_ASSIGN_OR_RETURN(Value * m, Op("Mul", {act, up}, "/mlp/Mul"));
      return Linear(m, "down_proj");
    }
    GF_ASSIGN_OR_RETURN(Value * f, Linear(h, "fc_in"));
    GF_ASSIGN_OR_RETURN(Value * act, Op(c_.family == BlockFamily::kGpt2 ? "GeluTanh" : "Gelu", {f}, "/mlp/Gelu"));
    return Linear(act, "fc_out");
  }

  Status Build() {
    GF_ASSIGN_OR_RETURN(Value * x, g_.AddInput("x", DType::kF32, {c_.batch, c_.seq, c_.hidden}));
    Value* y = nullptr;
    if (c_.family == BlockFamily::kBert) {  // post-norm
      GF_ASSIGN_OR_RETURN(Value * a, Attention(x));
      GF_ASSIGN_OR_RETURN(Value * r1, Op("Add", {a, x}, "/attn/residual/Add"));
      GF_ASSIGN_OR_RETURN(Value * h1, Norm(r1, "input_norm"));
      GF_ASSIGN_OR_RETURN(Value * m, Mlp(h1));
      GF_ASSIGN_OR_RETURN(Value * r2, Op("Add", {m, h1}, "/mlp/residual/Add"));
      GF_ASSIGN_OR_RETURN(y, Norm(r2, "post_norm"));
    } else {  // pre-norm
      GF_ASSIGN_OR_RETURN(Value * h, Norm(x, "input_norm"));
      GF_ASSIGN_OR_RETURN(Value * a, Attention(h));
      GF_ASSIGN_OR_RETURN(Value * r1, Op("Add", {x, a}, "/attn/residual/Add"));
      GF_ASSIGN_OR_RETURN(Value * h2, Norm(r1, "post_norm"));
      GF_ASSIGN_OR_RETURN(Value * m, Mlp(h2));
      GF_ASSIGN_OR_RETURN(y, Op("Add", {r1, m}, "/mlp/residual/Add"));
    }
    GF_RETURN_IF_ERROR(g_.RenameValue(y, "y"));
    GF_RETURN_IF_ERROR(g_.MarkOutput(y));
    if (c_.past > 0) {
      GF_RETURN_IF_ERROR(g_.RenameValue(present_k_, "present_key"));
      GF_RETURN_IF_ERROR(g_.RenameValue(present_v_, "present_value"));
      GF_RETURN_IF_ERROR(g_.MarkOutput(present_k_));
      GF_RETURN_IF_ERROR(g_.MarkOutput(present_v_));
    }
    return Status::Ok();
  }

 private:
  Graph& g_;
  const BlockConfig& c_;
  const BlockWeights& w_;
  Value *present_k_ = nullptr, *present_v_ = nullptr;  // with a KV cache
};

}  // namespace

int64_t BlockConfig::WeightCount() const {
  int64_t n = 0;
  for (const Spec& s : WeightSpecs(*this))
    if (s.kind == Spec::kUniform) {
      int64_t k = 1;
      for (int64_t d : s.shape) k *= d;
      n += k;
    }
  return n;
}

std::vector<std::string> BlockPresetNames() { return {"llama7b", "llama-small", "gpt2", "bert"}; }

Result<BlockConfig> BlockPreset(const std::string& name) {
  BlockConfig c;
  c.preset = name;
  if (name == "llama7b") return c;  // hidden 4096, 32 heads, ffn 11008, seq 32
  if (name == "llama-small") {
    c.hidden = 512, c.heads = 8, c.ffn = 1376, c.seq = 128;
    return c;
  }
  if (name == "gpt2" || name == "bert") {
    c.family = name == "gpt2" ? BlockFamily::kGpt2 : BlockFamily::kBert;
    c.hidden = 768, c.heads = 12, c.ffn = 3072, c.seq = 128, c.eps = 1e-5f;
    return c;
  }
  std::string known;
  for (const std::string& n : BlockPresetNames()) known += (known.empty() ? "" : ", ") + n;
  return InvalidArgument("unknown block preset '", name, "' (presets: ", known, ")");
}

std::shared_ptr<const Tensor> BlockWeights::Get(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  return nullptr;
}

Result<BlockWeights> MakeBlockWeights(const BlockConfig& c, uint32_t seed, const CpuContext& ctx,
                                      const std::function<void(double)>& progress) {
  if (c.hidden <= 0 || c.heads <= 0 || c.hidden % c.heads != 0 || c.head_dim() % 2 != 0)
    return InvalidArgument("block: hidden ", c.hidden, " must split into ", c.heads, " heads of even size");
  if (c.seq <= 0 || c.ffn <= 0 || c.batch <= 0)
    return InvalidArgument("block: seq, ffn and batch must be positive (seq ", c.seq, ", ffn ", c.ffn, ")");
  if (c.past < 0) return InvalidArgument("block: past ", c.past, " must not be negative");
  if (c.past > 0 && c.family == BlockFamily::kBert)
    return InvalidArgument("block: the BERT block is an encoder (no causal attention): it takes no KV cache (past ", c.past, ")");
  const std::vector<Spec> specs = WeightSpecs(c);
  int64_t total = 0, done = 0;
  for (const Spec& s : specs) {
    int64_t k = 1;
    for (int64_t d : s.shape) k *= d;
    total += k;
  }
  BlockWeights w;
  for (const Spec& s : specs) {
    GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kF32, s.shape));
    float* p = t.data_as<float>();
    const int64_t n = t.numel();
    constexpr int64_t kChunk = 1 << 22;  // report progress every 16 MiB
    for (int64_t b = 0; b < n; b += kChunk) {
      const int64_t e = std::min(n, b + kChunk);
      auto fill = [&](int tid, int nt) {
        const int64_t lo = b + (e - b) * tid / nt, hi = b + (e - b) * (tid + 1) / nt;
        Fill(s, c, seed, p, lo, hi);
      };
      if (ctx.pool && e - b > 4096) ctx.pool->Parallel(ctx.pool->num_threads(), [&](int tid, int nt) { fill(tid, nt); });
      else fill(0, 1);
      done += e - b;
      if (progress) progress(static_cast<double>(done) / static_cast<double>(total));
    }
    w.tensors.emplace_back(s.name, std::make_shared<const Tensor>(std::move(t)));
  }
  return w;
}

Status BuildBlock(Graph& g, const BlockConfig& c, const BlockWeights& w) {
  return BlockBuilder(g, c, w).Build();
}

bool IsWeightGemm(const Node& n) {
  if (n.is(op::FusedGemm)) return true;
  if (!n.is(op::MatMul) && !n.is(op::Gemm)) return false;
  return n.input(1) && n.input(1)->constant();
}

}  // namespace graphfuse
