// The ops opsets 22-24 add, written as the ops graphfuse already fuses (ONNX's own function
// bodies and reference implementations define them; the forms below compute the same):
//
//   Attention(Q, K, V, mask?, past_key?, past_value?, nonpad_kv_seqlen?)   (opset 23, 24)
//     3-D Q [B,S,Hq*d] (K, V [B,T,KV*d]) -> Transpose(Reshape(x, [0,0,heads,-1]), 0,2,1,3)
//     present_key = Concat(past_key, K, axis 2) (K itself without a past); present_value alike
//     Hq > KV (grouped-query)          -> Reshape(Expand(Unsqueeze(present, 2)), [B,Hq,T,d])
//     scores = MatMul(Q, Transpose(K, 0,1,3,2)) * scale          (scale: 1/sqrt(d) by default)
//     softcap > 0                      -> softcap * Tanh(scores / softcap)
//     a float mask                     -> Add(scores, mask)
//     a bool mask, is_causal, nonpad_kv_seqlen -> Where(And(mask, causal, keys < nonpad),
//                                                        scores, -inf)
//        (causal: key j <= query i + the past's length, or + nonpad_kv_seqlen - S per batch;
//         a mask shorter than the keys is padded with false / -inf, as the reference pads it)
//     Y = MatMul(Where(IsNaN(Softmax(scores)), 0, ·), V)  (a row masked everywhere gives 0)
//     3-D Y                            -> Reshape(Transpose(Y, 0,2,1,3), [0,0,-1])
//   which FuseAttention runs as one FusedAttention (FusedCachedAttention with a past), unless the
//   node asks for qk_matmul_output (an Identity of the scores at the stage its mode names: the
//   scores are then written out and the MatMuls run apart). softmax_precision changes nothing
//   (the kernels accumulate the softmax in f32).
//
//   RotaryEmbedding(X, cos_cache, sin_cache, position_ids?)                 (opset 23)
//     cos / sin [B,S,r/2] (or [max_pos, r/2] gathered at position_ids), r = rotary_embedding_dim
//     (the head size by default); X [B,H,S,d] or [B,S,H*d] (num_heads):
//     rotate-half   -> Rope(X[..., :r], Concat(cos, cos), Concat(sin, sin)), X[..., r:] after it
//     interleaved   -> pairs (x[2i], x[2i+1]) rotated with Slices of step 2, interleaved back
//
//   RMSNormalization(X, scale){axis, epsilon, stash_type = 1}  -> RMSNorm(X, scale){axis, epsilon}
//   Swish(X){alpha}                                            -> X * Sigmoid(alpha * X)
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>

#include "onnx/node_import.h"

#include <onnx/onnx_pb.h>

namespace graphfuse::onnx_import {
namespace {

Result<int64_t> IntAttr(const NodeImport& n, const char* key, int64_t def) {
  auto it = n.attrs.find(key);
  if (it == n.attrs.end()) return def;
  if (!std::holds_alternative<int64_t>(it->second)) return InvalidArgument("attribute '", key, "' must be an int");
  return std::get<int64_t>(it->second);
}

Result<std::optional<float>> FloatAttr(const NodeImport& n, const char* key) {
  auto it = n.attrs.find(key);
  if (it == n.attrs.end()) return std::optional<float>();
  if (!std::holds_alternative<float>(it->second)) return InvalidArgument("attribute '", key, "' must be a float");
  return std::optional<float>(std::get<float>(it->second));
}

Value* Input(const NodeImport& n, size_t i) { return i < n.inputs.size() ? n.inputs[i] : nullptr; }

Result<Value*> BoolConstant(NodeImport& n, const std::string& what, const Shape& shape,
                            const std::function<bool(int64_t)>& at) {
  GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kBool, shape));
  auto* p = static_cast<uint8_t*>(t.data());
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = at(i);
  return n.g.AddConstant(n.g.FreshName(StrCat(n.name, "/", what)), std::make_shared<const Tensor>(std::move(t)));
}

Result<Value*> I64Constant(NodeImport& n, const std::string& what, const Shape& shape,
                           const std::function<int64_t(int64_t)>& at) {
  GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kI64, shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<int64_t>()[i] = at(i);
  return n.g.AddConstant(n.g.FreshName(StrCat(n.name, "/", what)), std::make_shared<const Tensor>(std::move(t)));
}

// [B,S,heads*d] -> heads [B,heads,S,d].
Result<Value*> SplitHeads(NodeImport& n, Value* x, int64_t heads) {
  GF_ASSIGN_OR_RETURN(Value * shape, Int64sConstant(n, "heads_shape", {0, 0, heads, -1}));
  GF_ASSIGN_OR_RETURN(Value * r, Emit(n, "Reshape", {x, shape}, {}, false));
  return Emit(n, "Transpose", {r}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}}, false);
}

// Heads [B,KV,T,d] read by `h` query heads: each KV head repeated h / KV times, as repeat_kv.
Result<Value*> RepeatHeads(NodeImport& n, Value* x, int64_t h) {
  const Shape& s = x->shape();
  const int64_t kv = s[1];
  if (kv == h) return x;
  GF_ASSIGN_OR_RETURN(Value * axes, Int64sConstant(n, "axes", {2}));
  GF_ASSIGN_OR_RETURN(Value * u, Emit(n, "Unsqueeze", {x, axes}, {}, false));
  GF_ASSIGN_OR_RETURN(Value * to, Int64sConstant(n, "expand_shape", {s[0], kv, h / kv, s[2], s[3]}));
  GF_ASSIGN_OR_RETURN(Value * e, Emit(n, "Expand", {u, to}, {}, false));
  GF_ASSIGN_OR_RETURN(Value * shape, Int64sConstant(n, "heads_shape", {s[0], h, s[2], s[3]}));
  return Emit(n, "Reshape", {e, shape}, {}, false);
}

// Pads the mask's last dim to `t` keys with `fill` (false / -inf), as the reference pads it.
Result<Value*> PadMask(NodeImport& n, Value* mask, int64_t t) {
  const Shape& s = mask->shape();
  const int64_t have = s.back();
  if (have == t) return mask;
  if (have > t)
    return InvalidArgument("attn_mask ", mask->TypeString(), " has more columns than the ", t, " keys");
  Shape pad_shape = s;
  pad_shape.back() = t - have;
  GF_ASSIGN_OR_RETURN(Tensor pad, Tensor::Empty(mask->dtype(), pad_shape));
  const double fill = mask->dtype() == DType::kBool ? 0.0 : -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < pad.numel(); ++i) pad.SetFromDouble(i, fill);
  GF_ASSIGN_OR_RETURN(Value * pv, n.g.AddConstant(n.g.FreshName(n.name + "/mask_pad"),
                                                  std::make_shared<const Tensor>(std::move(pad))));
  return Emit(n, "Concat", {mask, pv}, {{"axis", int64_t{-1}}}, false);
}

Result<Value*> AndMasks(NodeImport& n, Value* a, Value* b) {
  if (!a) return b;
  if (!b) return a;
  return Emit(n, "And", {a, b}, {}, false);
}

}  // namespace

Status ImportAttention(NodeImport& n) {
  GF_RETURN_IF_ERROR(RequireInputs(n, 3, 7));
  GF_RETURN_IF_ERROR(CheckOutputs(n, 4));
  const bool qk_out = !OnnxOutput(n, 3).empty();
  Value *q = n.inputs[0], *k = n.inputs[1], *v = n.inputs[2];
  Value* mask = Input(n, 3);
  Value *past_k = Input(n, 4), *past_v = Input(n, 5), *nonpad = Input(n, 6);
  GF_ASSIGN_OR_RETURN(const int64_t causal, IntAttr(n, "is_causal", 0));
  GF_ASSIGN_OR_RETURN(const int64_t q_heads_attr, IntAttr(n, "q_num_heads", 0));
  GF_ASSIGN_OR_RETURN(const int64_t kv_heads_attr, IntAttr(n, "kv_num_heads", 0));
  GF_ASSIGN_OR_RETURN(const std::optional<float> scale_attr, FloatAttr(n, "scale"));
  GF_ASSIGN_OR_RETURN(const std::optional<float> softcap, FloatAttr(n, "softcap"));
  GF_ASSIGN_OR_RETURN(const int64_t qk_mode, IntAttr(n, "qk_matmul_output_mode", 0));
  if (qk_mode < 0 || qk_mode > 3) return InvalidArgument("qk_matmul_output_mode ", qk_mode, " is not 0..3");
  if ((past_k == nullptr) != (past_v == nullptr)) return InvalidArgument("past_key and past_value come together");
  if (nonpad && past_k) return InvalidArgument("nonpad_kv_seqlen cannot be given with past_key / past_value");
  for (Value* x : {q, k, v})
    if (!IsFloat(x->dtype()) || x->dtype() != q->dtype())
      return InvalidArgument("Q, K and V must share one float type; got ", q->TypeString(), ", ", k->TypeString(),
                             ", ", v->TypeString());
  const size_t rank = q->shape().size();
  if (rank != k->shape().size() || rank != v->shape().size() || (rank != 3 && rank != 4))
    return InvalidArgument("Q, K and V must all be 3-D or all 4-D; got ", q->TypeString(), ", ", k->TypeString(),
                           ", ", v->TypeString());
  Value *q4 = q, *k4 = k, *v4 = v;
  if (rank == 3) {
    if (q_heads_attr <= 0 || kv_heads_attr <= 0)
      return InvalidArgument("3-D Q, K, V need q_num_heads and kv_num_heads");
    if (q->shape()[2] % q_heads_attr != 0 || k->shape()[2] % kv_heads_attr != 0 || v->shape()[2] % kv_heads_attr != 0)
      return InvalidArgument("the hidden sizes of ", q->TypeString(), ", ", k->TypeString(), ", ", v->TypeString(),
                             " do not split into q_num_heads = ", q_heads_attr, " and kv_num_heads = ", kv_heads_attr,
                             " heads");
    GF_ASSIGN_OR_RETURN(q4, SplitHeads(n, q, q_heads_attr));
    GF_ASSIGN_OR_RETURN(k4, SplitHeads(n, k, kv_heads_attr));
    GF_ASSIGN_OR_RETURN(v4, SplitHeads(n, v, kv_heads_attr));
  } else if (q_heads_attr > 0 || kv_heads_attr > 0) {
    return InvalidArgument("q_num_heads and kv_num_heads are for 3-D inputs; Q is ", q->TypeString());
  }
  const Shape qs = q4->shape(), ks = k4->shape(), vs = v4->shape();
  const int64_t b = qs[0], h = qs[1], s = qs[2], d = qs[3], kv = ks[1];
  if (ks[0] != b || vs[0] != b || vs[1] != kv || ks[3] != d || vs[2] != ks[2] || kv <= 0 || h % kv != 0)
    return InvalidArgument("needs Q [B,H,S,d], K [B,KV,T,d], V [B,KV,T,dv] with KV dividing H; got ",
                           q4->TypeString(), ", ", k4->TypeString(), ", ", v4->TypeString());
  if (past_k) {
    for (Value* p : {past_k, past_v}) {
      const Shape& ps = p->shape();
      const Shape& with = p == past_k ? ks : vs;
      if (ps.size() != 4 || ps[0] != b || ps[1] != kv || ps[3] != with[3] || p->dtype() != q->dtype())
        return InvalidArgument("past ", p->TypeString(), " does not match ", ShapeToString(with),
                               " ([B,KV,past,d], Q's type)");
    }
  }
  const int64_t past = past_k ? past_k->shape()[2] : 0;
  const int64_t t = past + ks[2];

  // The cache outputs: the past with the new keys / values after it.
  Value *present_k = k4, *present_v = v4;
  if (past_k) {
    GF_ASSIGN_OR_RETURN(present_k, EmitOutput(n, 1, "Concat", {past_k, k4}, {{"axis", int64_t{2}}}));
    GF_ASSIGN_OR_RETURN(present_v, EmitOutput(n, 2, "Concat", {past_v, v4}, {{"axis", int64_t{2}}}));
  } else {
    if (!OnnxOutput(n, 1).empty()) GF_RETURN_IF_ERROR(EmitOutput(n, 1, "Identity", {k4}, {}).status());
    if (!OnnxOutput(n, 2).empty()) GF_RETURN_IF_ERROR(EmitOutput(n, 2, "Identity", {v4}, {}).status());
  }
  GF_ASSIGN_OR_RETURN(Value * kr, RepeatHeads(n, present_k, h));
  GF_ASSIGN_OR_RETURN(Value * vr, RepeatHeads(n, present_v, h));

  GF_ASSIGN_OR_RETURN(Value * kt, Emit(n, "Transpose", {kr}, {{"perm", std::vector<int64_t>{0, 1, 3, 2}}}, false));
  GF_ASSIGN_OR_RETURN(Value * scores, Emit(n, "MatMul", {q4, kt}, {}, false));
  const double scale = scale_attr ? *scale_attr : 1.0 / std::sqrt(static_cast<double>(d));
  GF_ASSIGN_OR_RETURN(Value * sc, ScalarConstant(n, q->dtype(), scale));
  GF_ASSIGN_OR_RETURN(scores, Emit(n, "Mul", {scores, sc}, {}, false));
  if (softcap && *softcap > 0) {
    GF_ASSIGN_OR_RETURN(Value * inv, ScalarConstant(n, q->dtype(), 1.0 / *softcap));
    GF_ASSIGN_OR_RETURN(Value * cap, ScalarConstant(n, q->dtype(), *softcap));
    GF_ASSIGN_OR_RETURN(scores, Emit(n, "Mul", {scores, inv}, {}, false));
    GF_ASSIGN_OR_RETURN(scores, Emit(n, "Tanh", {scores}, {}, false));
    GF_ASSIGN_OR_RETURN(scores, Emit(n, "Mul", {scores, cap}, {}, false));
  }
  // qk_matmul_output (which keeps these scores from the one kernel): as the reference gives it,
  // the scaled (and soft-capped) scores for modes 0 and 1, the masked ones for 2, P for 3.
  auto qk_output = [&](Value* at) { return EmitOutput(n, 3, "Identity", {at}, {}).status(); };
  if (qk_out && qk_mode <= 1) GF_RETURN_IF_ERROR(qk_output(scores));

  // Masks: a float one added; the bool mask, the causal frontier and the keys past each batch's
  // nonpad_kv_seqlen selecting (a score they drop becomes -inf).
  Value* keep = nullptr;
  bool masked = false;
  if (mask) {
    if (mask->shape().empty())
      return InvalidArgument("attn_mask must have rank >= 1, it is ", mask->TypeString());
    if (mask->dtype() != DType::kBool && mask->dtype() != q->dtype())
      return InvalidArgument("attn_mask must be bool or Q's type ", DTypeName(q->dtype()), ", it is ",
                             mask->TypeString());
    GF_ASSIGN_OR_RETURN(Value * padded, PadMask(n, mask, t));
    if (padded->dtype() == DType::kBool) {
      keep = padded;
    } else {
      GF_ASSIGN_OR_RETURN(scores, Emit(n, "Add", {scores, padded}, {}, false));
    }
    masked = true;
  }
  if (causal && nonpad) {
    // Per batch: key j is kept where j <= i + nonpad[b] - S, i.e. j < i + 1 - S + nonpad[b].
    GF_ASSIGN_OR_RETURN(Value * rows, I64Constant(n, "causal_rows", {s, 1}, [&](int64_t i) { return i + 1 - s; }));
    GF_ASSIGN_OR_RETURN(Value * shape, Int64sConstant(n, "batch_shape", {b, 1, 1, 1}));
    GF_ASSIGN_OR_RETURN(Value * nb, Emit(n, "Reshape", {nonpad, shape}, {}, false));
    GF_ASSIGN_OR_RETURN(Value * limit, Emit(n, "Add", {nb, rows}, {}, false));
    GF_ASSIGN_OR_RETURN(Value * cols, I64Constant(n, "key_index", {1, t}, [](int64_t j) { return j; }));
    GF_ASSIGN_OR_RETURN(Value * allowed, Emit(n, "Less", {cols, limit}, {}, false));
    GF_ASSIGN_OR_RETURN(keep, AndMasks(n, keep, allowed));
    masked = true;
  } else if (causal) {
    GF_ASSIGN_OR_RETURN(Value * allowed,
                        BoolConstant(n, "causal_mask", {s, t}, [&](int64_t i) { return i % t <= i / t + past; }));
    GF_ASSIGN_OR_RETURN(keep, AndMasks(n, keep, allowed));
    masked = true;
  }
  if (nonpad) {
    if (nonpad->dtype() != DType::kI64 || nonpad->numel() != b)
      return InvalidArgument("nonpad_kv_seqlen must be i64[", b, "], it is ", nonpad->TypeString());
    GF_ASSIGN_OR_RETURN(Value * shape, Int64sConstant(n, "batch_shape", {b, 1, 1, 1}));
    GF_ASSIGN_OR_RETURN(Value * nb, Emit(n, "Reshape", {nonpad, shape}, {}, false));
    GF_ASSIGN_OR_RETURN(Value * cols, I64Constant(n, "key_index", {1, 1, 1, t}, [](int64_t j) { return j; }));
    GF_ASSIGN_OR_RETURN(Value * in_batch, Emit(n, "Less", {cols, nb}, {}, false));
    GF_ASSIGN_OR_RETURN(keep, AndMasks(n, keep, in_batch));
    masked = true;
  }
  if (keep) {
    GF_ASSIGN_OR_RETURN(Value * fill, ScalarConstant(n, q->dtype(), -std::numeric_limits<double>::infinity()));
    GF_ASSIGN_OR_RETURN(scores, Emit(n, "Where", {keep, scores, fill}, {}, false));
  }
  if (qk_out && qk_mode == 2) GF_RETURN_IF_ERROR(qk_output(scores));
  GF_ASSIGN_OR_RETURN(Value * p, Emit(n, "Softmax", {scores}, {{"axis", int64_t{-1}}}, false));
  if (masked) {
    GF_ASSIGN_OR_RETURN(Value * nan, Emit(n, "IsNaN", {p}, {}, false));
    GF_ASSIGN_OR_RETURN(Value * zero, ScalarConstant(n, q->dtype(), 0.0));
    GF_ASSIGN_OR_RETURN(p, Emit(n, "Where", {nan, zero, p}, {}, false));
  }
  if (qk_out && qk_mode == 3) GF_RETURN_IF_ERROR(qk_output(p));
  if (rank == 4) return Emit(n, "MatMul", {p, vr}, {}, true).status();
  GF_ASSIGN_OR_RETURN(Value * y4, Emit(n, "MatMul", {p, vr}, {}, false));
  GF_ASSIGN_OR_RETURN(Value * y, Emit(n, "Transpose", {y4}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}}, false));
  GF_ASSIGN_OR_RETURN(Value * shape, Int64sConstant(n, "output_shape", {0, 0, -1}));
  return Emit(n, "Reshape", {y, shape}, {}, true).status();
}

Status ImportRotaryEmbedding(NodeImport& n) {
  GF_RETURN_IF_ERROR(CheckOutputs(n, 1));
  GF_RETURN_IF_ERROR(RequireInputs(n, 3, 4));
  Value *x = n.inputs[0], *cos = n.inputs[1], *sin = n.inputs[2], *pos = Input(n, 3);
  GF_ASSIGN_OR_RETURN(const int64_t interleaved, IntAttr(n, "interleaved", 0));
  GF_ASSIGN_OR_RETURN(int64_t rot, IntAttr(n, "rotary_embedding_dim", 0));
  GF_ASSIGN_OR_RETURN(const int64_t heads, IntAttr(n, "num_heads", 0));
  if (!IsFloat(x->dtype()) || cos->dtype() != x->dtype() || sin->dtype() != x->dtype())
    return InvalidArgument("X, cos_cache and sin_cache must share one float type; got ", x->TypeString(), ", ",
                           cos->TypeString(), ", ", sin->TypeString());
  const Shape xs = x->shape();
  if (xs.size() != 3 && xs.size() != 4) return InvalidArgument("X must be 3-D or 4-D, it is ", x->TypeString());
  // Work on [B,S,H,d] (3-D X split into heads) or on [B,H,S,d] as given.
  Value* x4 = x;
  if (xs.size() == 3) {
    if (heads <= 0 || xs[2] % heads != 0)
      return InvalidArgument("3-D X ", x->TypeString(), " needs num_heads dividing its last dim");
    GF_ASSIGN_OR_RETURN(Value * shape, Int64sConstant(n, "heads_shape", {0, 0, heads, -1}));
    GF_ASSIGN_OR_RETURN(x4, Emit(n, "Reshape", {x, shape}, {}, false));
  }
  const int64_t d = x4->shape()[3];
  const int64_t bsz = x4->shape()[0], seq = xs.size() == 3 ? xs[1] : xs[2];
  if (rot == 0) rot = d;
  if (rot <= 0 || rot > d || rot % 2 != 0)
    return InvalidArgument("rotary_embedding_dim ", rot, " must be even and at most the head size ", d);
  if (pos) {
    if ((pos->dtype() != DType::kI64 && pos->dtype() != DType::kI32) || pos->shape() != Shape{bsz, seq})
      return InvalidArgument("position_ids must be integers [", bsz, ",", seq, "], they are ", pos->TypeString());
    if (cos->shape().size() != 2 || sin->shape() != cos->shape())
      return InvalidArgument("with position_ids, cos_cache and sin_cache are [max_position, ", rot / 2, "]; got ",
                             cos->TypeString(), ", ", sin->TypeString());
    GF_ASSIGN_OR_RETURN(cos, Emit(n, "Gather", {cos, pos}, {{"axis", int64_t{0}}}, false));
    GF_ASSIGN_OR_RETURN(sin, Emit(n, "Gather", {sin, pos}, {{"axis", int64_t{0}}}, false));
  }
  // (A batch of 1 broadcasts, as the reference's numpy does: the dynamo exporter writes the
  // tables of one batch row.)
  const Shape& cs = cos->shape();
  if (cs.size() != 3 || (cs[0] != bsz && cs[0] != 1) || cs[1] != seq || cs[2] != rot / 2 || sin->shape() != cs)
    return InvalidArgument("cos_cache and sin_cache must be [", bsz, " (or 1),", seq, ",", rot / 2,
                           "] (or [max_position, ", rot / 2, "] with position_ids); got ", cos->TypeString(), ", ",
                           sin->TypeString());
  // The tables broadcast over the heads: [B,S,1,r/2] against [B,S,H,d], [B,1,S,r/2] against [B,H,S,d].
  GF_ASSIGN_OR_RETURN(Value * head_axis, Int64sConstant(n, "axes", {xs.size() == 3 ? 2 : 1}));
  GF_ASSIGN_OR_RETURN(cos, Emit(n, "Unsqueeze", {cos, head_axis}, {}, false));
  GF_ASSIGN_OR_RETURN(sin, Emit(n, "Unsqueeze", {sin, head_axis}, {}, false));
  auto slice = [&](Value* v, int64_t from, int64_t to, int64_t step) -> Result<Value*> {
    GF_ASSIGN_OR_RETURN(Value * starts, Int64sConstant(n, "starts", {from}));
    GF_ASSIGN_OR_RETURN(Value * ends, Int64sConstant(n, "ends", {to}));
    GF_ASSIGN_OR_RETURN(Value * axes, Int64sConstant(n, "axes", {-1}));
    GF_ASSIGN_OR_RETURN(Value * steps, Int64sConstant(n, "steps", {step}));
    return Emit(n, "Slice", {v, starts, ends, axes, steps}, {}, false);
  };
  Value* xr = x4;
  if (rot < d) {
    GF_ASSIGN_OR_RETURN(xr, slice(x4, 0, rot, 1));
  }
  const bool rotated_last = xs.size() == 4 && rot == d;  // the rotation gives Y itself
  Value* y = nullptr;
  if (!interleaved) {
    GF_ASSIGN_OR_RETURN(Value * c2, Emit(n, "Concat", {cos, cos}, {{"axis", int64_t{-1}}}, false));
    GF_ASSIGN_OR_RETURN(Value * s2, Emit(n, "Concat", {sin, sin}, {{"axis", int64_t{-1}}}, false));
    GF_ASSIGN_OR_RETURN(y, Emit(n, "Rope", {xr, c2, s2}, {}, rotated_last));
  } else {
    GF_ASSIGN_OR_RETURN(Value * x1, slice(xr, 0, rot, 2));
    GF_ASSIGN_OR_RETURN(Value * x2, slice(xr, 1, rot, 2));
    GF_ASSIGN_OR_RETURN(Value * c1, Emit(n, "Mul", {cos, x1}, {}, false));
    GF_ASSIGN_OR_RETURN(Value * s1, Emit(n, "Mul", {sin, x2}, {}, false));
    GF_ASSIGN_OR_RETURN(Value * real, Emit(n, "Sub", {c1, s1}, {}, false));
    GF_ASSIGN_OR_RETURN(Value * c2, Emit(n, "Mul", {sin, x1}, {}, false));
    GF_ASSIGN_OR_RETURN(Value * s2, Emit(n, "Mul", {cos, x2}, {}, false));
    GF_ASSIGN_OR_RETURN(Value * imag, Emit(n, "Add", {c2, s2}, {}, false));
    GF_ASSIGN_OR_RETURN(Value * last, Int64sConstant(n, "axes", {-1}));
    GF_ASSIGN_OR_RETURN(real, Emit(n, "Unsqueeze", {real, last}, {}, false));
    GF_ASSIGN_OR_RETURN(imag, Emit(n, "Unsqueeze", {imag, last}, {}, false));
    GF_ASSIGN_OR_RETURN(Value * pairs, Emit(n, "Concat", {real, imag}, {{"axis", int64_t{-1}}}, false));
    Shape to = xr->shape();
    GF_ASSIGN_OR_RETURN(Value * shape, Int64sConstant(n, "shape", std::vector<int64_t>(to.begin(), to.end())));
    GF_ASSIGN_OR_RETURN(y, Emit(n, "Reshape", {pairs, shape}, {}, rotated_last));
  }
  if (rot < d) {
    GF_ASSIGN_OR_RETURN(Value * rest, slice(x4, rot, d, 1));
    GF_ASSIGN_OR_RETURN(y, Emit(n, "Concat", {y, rest}, {{"axis", int64_t{-1}}}, xs.size() == 4));
  }
  if (xs.size() == 3) {
    GF_ASSIGN_OR_RETURN(Value * shape, Int64sConstant(n, "output_shape", {0, 0, -1}));
    return Emit(n, "Reshape", {y, shape}, {}, true).status();
  }
  return Status::Ok();
}

Status ImportRmsNormalization(NodeImport& n) {
  GF_RETURN_IF_ERROR(CheckOutputs(n, 1));
  GF_RETURN_IF_ERROR(RequireInputs(n, 2, 2));
  GF_ASSIGN_OR_RETURN(const int64_t stash, IntAttr(n, "stash_type", 1));
  if (stash != 1) return Unimplemented("stash_type ", stash, " is not supported (only 1: f32 statistics)");
  GF_ASSIGN_OR_RETURN(const int64_t axis, IntAttr(n, "axis", -1));
  GF_ASSIGN_OR_RETURN(const std::optional<float> eps, FloatAttr(n, "epsilon"));
  AttributeMap a{{"axis", axis}, {"epsilon", eps ? *eps : 1e-5f}};
  return Emit(n, "RMSNorm", {n.inputs[0], n.inputs[1]}, std::move(a), true).status();
}

Status ImportSwish(NodeImport& n) {
  GF_RETURN_IF_ERROR(CheckOutputs(n, 1));
  GF_RETURN_IF_ERROR(RequireInputs(n, 1, 1));
  GF_ASSIGN_OR_RETURN(const std::optional<float> alpha, FloatAttr(n, "alpha"));
  Value* x = n.inputs[0];
  Value* ax = x;
  if (alpha && *alpha != 1.f) {
    GF_ASSIGN_OR_RETURN(Value * a, ScalarConstant(n, x->dtype(), *alpha));
    GF_ASSIGN_OR_RETURN(ax, Emit(n, "Mul", {x, a}, {}, false));
  }
  GF_ASSIGN_OR_RETURN(Value * sig, Emit(n, "Sigmoid", {ax}, {}, false));
  return Emit(n, "Mul", {x, sig}, {}, true).status();
}

}  // namespace graphfuse::onnx_import
