// ONNX node -> IR node(s).
//
// Most ONNX ops map 1:1: the registry (src/ir/op_registry.h) knows them under their ONNX
// op_type with ONNX's inputs and attributes, so the node is added as is. The table below lists
// the ops whose ONNX form differs and how each becomes IR:
//
//   Constant                  -> a graph constant (value, value_float(s), value_int(s))
//   Clip(x, min?, max?)       -> Clip(x){alpha=min, beta=max} for float data and constant bounds;
//                                else (bounds given at run time, integer data, a NaN bound)
//                                Min(Max(x, min), max): Clip's definition, min > max included
//   Cast{to=<ONNX enum>}      -> Cast(x){to=DType};  CastLike(x, y) -> Cast(x){to=dtype(y)}
//   Dropout(x, ratio?, mode?) -> Dropout(x){training=0} (inference identity); mode must be a
//                                constant false; the mask output is not supported
//   LeakyRelu/HardSigmoid/Elu/Selu -> same op, ONNX default alpha/beta (Selu's gamma) filled in
//   Max/Min/Sum(x0..xn)       -> a chain of binary Max/Min/Add (Identity for one input)
//   Mean(x0..xn)              -> Sum chain, then Div by n
//   LessOrEqual(a, b)         -> Or(Less(a, b), Equal(a, b))   (NaN compares false in both)
//   GreaterOrEqual(a, b)      -> Or(Greater(a, b), Equal(a, b))
//   Xor(a, b)                 -> Not(Equal(a, b))
//   PRelu(x, slope)           -> Where(Less(x, 0), Mul(x, slope), x)
//   HardSwish(x)              -> Mul(x, HardSigmoid(x){alpha=1/6, beta=0.5})
//   Pow(x, y) with y's dtype != x's -> Pow(x, Cast(y){to=dtype(x)}); for an integer x and a
//                                float y: Cast(Pow(Cast(x){to=f32}, y'){to=dtype(x)}, y' = y in f32
//   Gelu{approximate}         -> Gelu, or GeluTanh for approximate="tanh" (ONNX opset 20 form)
//   Split(x) without 'split'  -> Split(x){num_outputs=<number of node outputs>} (opset 18 form)
//   Einsum{equation}          -> Transpose / ReduceSum / Reshape / MatMul / Mul (src/onnx/einsum.h):
//                                "bhqd,bhkd->bhqk" is Transpose + MatMul, "ij,jk->ik" a MatMul
//
// Nodes of other opsets are first rewritten to their opset 13-17 form (UpgradeForm):
//   Softmax/LogSoftmax < 13   the input is coerced to 2-D at `axis` (default 1): over the last
//                             axis as is, else Reshape(Softmax(Flatten(x){axis}){axis=-1}, shape(x))
//   Clip < 11                 min / max attributes -> constant inputs
//   Slice < 10                starts / ends / axes attributes -> constant inputs
//   TopK < 10                 the k attribute -> a constant K input
//   Pad < 11                  pads / value attributes -> constant inputs (value in x's dtype)
//   Split >= 18               num_outputs is honoured (ignored before 18, where it did not exist)
//   opsets 1-6                see UpgradeBefore7 (legacy attributes, axis-aligned broadcasting)
// Squeeze, Unsqueeze, ReduceSum and Split before 13, and the other reductions from 18, need
// nothing: their schemas take axes (and split) as an attribute or as a constant input.
#include "onnx/node_import.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "graphfuse/ops.h"
#include "ir/op_registry.h"
#include "onnx/einsum.h"
#include "onnx/tensor_proto.h"
#include "runtime/host_target.h"
#include "passes/fold_constants.h"

namespace graphfuse::onnx_import {
namespace {

// Import folds shape-only subgraphs as it builds, on the CPU (whatever the model is compiled for).
FoldOptions ImportFold() {
  FoldOptions o;
  o.target = &HostTarget();
  return o;
}

using ConvertFn = Status (*)(NodeImport& n);

}  // namespace

std::string OnnxOutput(const NodeImport& n, int k) {
  return k < n.proto.output_size() ? n.proto.output(k) : std::string();
}

Status CheckOutputs(const NodeImport& n, int supported) {
  for (int k = supported; k < n.proto.output_size(); ++k)
    if (!n.proto.output(k).empty())
      return Unimplemented("output ", k, " ('", n.proto.output(k), "') is not supported");
  return Status::Ok();
}

// Elementwise table ops defined on floats only are refused (as unsupported, not malformed) on
// integer inputs (Clip on integers is imported as Max / Min, above).
static Status CheckFloatOnly(const std::string& op, const std::vector<Value*>& ins) {
  auto kind = OpFromName(op);
  if (!kind.ok() || GetOpInfo(*kind).int_ok) return Status::Ok();
  for (Value* v : ins)
    if (v && !IsFloat(v->dtype()))
      return Unimplemented(op, " on ", DTypeName(v->dtype()), " inputs is not supported (floats only)");
  return Status::Ok();
}

// Adds one IR node. The final node of a conversion carries the ONNX node's name and output
// name; the intermediates get fresh names derived from it.
Result<Value*> Emit(NodeImport& n, const std::string& op, const std::vector<Value*>& ins, AttributeMap attrs,
                    bool final) {
  GF_RETURN_IF_ERROR(CheckFloatOnly(op, ins));
  std::string out = final ? OnnxOutput(n, 0) : std::string();
  if (out.empty()) out = n.g.FreshName(n.name + "/" + op);
  const std::string node_name = final ? n.name : n.g.FreshName(n.name + "/" + op);
  GF_ASSIGN_OR_RETURN(Node * node, n.g.AddNode(op, ins, std::move(attrs), node_name, 1, {out}));
  GF_RETURN_IF_ERROR(FoldNodeIfConstant(n.g, node, ImportFold()).status().WithContext(node->Describe()));
  return node->output(0);
}

Result<Value*> EmitOutput(NodeImport& n, int k, const std::string& op, const std::vector<Value*>& ins,
                          AttributeMap attrs) {
  GF_RETURN_IF_ERROR(CheckFloatOnly(op, ins));
  std::string out = OnnxOutput(n, k);
  if (out.empty()) out = n.g.FreshName(StrCat(n.name, "/output_", k));
  GF_ASSIGN_OR_RETURN(Node * node, n.g.AddNode(op, ins, std::move(attrs), n.g.FreshName(n.name + "/" + op), 1, {out}));
  GF_RETURN_IF_ERROR(FoldNodeIfConstant(n.g, node, ImportFold()).status().WithContext(node->Describe()));
  return node->output(0);
}

Result<Value*> ScalarConstant(NodeImport& n, DType dtype, double v) {
  GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(dtype, {}));
  t.SetFromDouble(0, v);
  return n.g.AddConstant(n.g.FreshName(n.name + "/const"), std::make_shared<const Tensor>(std::move(t)));
}

Result<Value*> Int64sConstant(NodeImport& n, const std::string& what, const std::vector<int64_t>& v) {
  GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kI64, {static_cast<int64_t>(v.size())}));
  if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * sizeof(int64_t));
  return n.g.AddConstant(n.g.FreshName(StrCat(n.name, "/", what)), std::make_shared<const Tensor>(std::move(t)));
}

namespace {

// The single value of constant input i; Unimplemented when it is not a constant.
Result<double> ConstantScalar(const NodeImport& n, size_t i, const char* what) {
  Value* v = i < n.inputs.size() ? n.inputs[i] : nullptr;
  if (!v) return InvalidArgument(what, " is absent");
  if (!v->constant()) return Unimplemented(what, " ('", v->name(), "') must be a constant");
  if (v->constant()->numel() != 1)
    return InvalidArgument(what, " ('", v->name(), "') must hold one value, it is ",
                           DTypeName(v->dtype()), ShapeToString(v->shape()));
  return v->constant()->GetAsDouble(0);
}

}  // namespace

Status RequireInputs(const NodeImport& n, size_t lo, size_t hi) {
  size_t present = 0;
  for (Value* v : n.inputs) present += v != nullptr;
  if (n.inputs.size() > hi || present < lo || (lo > 0 && n.inputs.size() < lo))
    return InvalidArgument("takes ", lo, lo == hi ? "" : StrCat("..", hi), " inputs, got ", n.inputs.size());
  for (size_t i = 0; i < lo; ++i)
    if (!n.inputs[i]) return InvalidArgument("input ", i, " is required");
  return Status::Ok();
}

namespace {

Status ImportDirect(NodeImport& n, const OpSchema& s);

// ---- the conversions ----

Status ImportConstant(NodeImport& n) {
  GF_RETURN_IF_ERROR(CheckOutputs(n, 1));
  if (!n.inputs.empty()) return InvalidArgument("Constant takes no inputs");
  if (n.attrs.size() != 1) return InvalidArgument("Constant needs exactly one value attribute, it has ", n.attrs.size());
  const std::string& key = n.attrs.begin()->first;  // not a structured binding: lambdas capture it
  const Attribute& attr = n.attrs.begin()->second;
  std::shared_ptr<const Tensor> data;
  auto make = [&](DType dt, const Shape& s, auto&& fill) -> Status {
    GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(dt, s));
    fill(t);
    data = std::make_shared<const Tensor>(std::move(t));
    return Status::Ok();
  };
  if (key == "value" && std::holds_alternative<std::shared_ptr<const Tensor>>(attr)) {
    data = std::get<std::shared_ptr<const Tensor>>(attr);
  } else if (key == "value_float" && std::holds_alternative<float>(attr)) {
    GF_RETURN_IF_ERROR(make(DType::kF32, {}, [&](Tensor& t) { t.data_as<float>()[0] = std::get<float>(attr); }));
  } else if (key == "value_int" && std::holds_alternative<int64_t>(attr)) {
    GF_RETURN_IF_ERROR(make(DType::kI64, {}, [&](Tensor& t) { t.data_as<int64_t>()[0] = std::get<int64_t>(attr); }));
  } else if (key == "value_floats" && std::holds_alternative<std::vector<float>>(attr)) {
    const auto& v = std::get<std::vector<float>>(attr);
    GF_RETURN_IF_ERROR(make(DType::kF32, {static_cast<int64_t>(v.size())}, [&](Tensor& t) {
      if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * sizeof(float));
    }));
  } else if (key == "value_ints" && std::holds_alternative<std::vector<int64_t>>(attr)) {
    const auto& v = std::get<std::vector<int64_t>>(attr);
    GF_RETURN_IF_ERROR(make(DType::kI64, {static_cast<int64_t>(v.size())}, [&](Tensor& t) {
      if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * sizeof(int64_t));
    }));
  } else if (key == "value_string" || key == "value_strings") {
    return Unimplemented("string constants are not supported");
  } else {
    return InvalidArgument("unexpected attribute '", key, "' (or wrong type) for a Constant");
  }
  std::string out = OnnxOutput(n, 0);
  if (out.empty()) out = n.g.FreshName(n.name);
  return n.g.AddConstant(out, std::move(data)).status();
}

// A Clip bound given as input i: of x's dtype, one value, of rank no larger than x's.
Result<Value*> ClipBound(const NodeImport& n, size_t i, const char* what) {
  Value* v = i < n.inputs.size() ? n.inputs[i] : nullptr;
  if (!v) return v;
  const Value* x = n.inputs[0];
  if (v->dtype() != x->dtype())
    return InvalidArgument(what, " ('", v->name(), "') is ", v->TypeString(), ", the input '", x->name(), "' is ",
                           x->TypeString(), ": they must have one type");
  if (v->numel() != 1 || v->shape().size() > x->shape().size())
    return InvalidArgument(what, " ('", v->name(), "') must hold one value, it is ", v->TypeString(), " (input '",
                           x->name(), "' is ", x->TypeString(), ")");
  return v;
}

Status ImportClip(NodeImport& n) {
  GF_RETURN_IF_ERROR(CheckOutputs(n, 1));
  GF_RETURN_IF_ERROR(RequireInputs(n, 1, 3));
  Value* x = n.inputs[0];
  GF_ASSIGN_OR_RETURN(Value * lo_v, ClipBound(n, 1, "min"));
  GF_ASSIGN_OR_RETURN(Value * hi_v, ClipBound(n, 2, "max"));
  if (IsFloat(x->dtype()) && (!lo_v || lo_v->constant()) && (!hi_v || hi_v->constant())) {
    const double lo = lo_v ? lo_v->constant()->GetAsDouble(0) : -INFINITY;
    const double hi = hi_v ? hi_v->constant()->GetAsDouble(0) : INFINITY;
    if (!std::isnan(lo) && !std::isnan(hi)) {
      // ONNX: when min > max every output is max, which is what min(max(x, max), max) gives.
      AttributeMap a{{"alpha", static_cast<float>(std::min(lo, hi))}, {"beta", static_cast<float>(hi)}};
      return Emit(n, "Clip", {x}, std::move(a), true).status();
    }
  }
  // Bounds that arrive at run time (scalar operands: the two ops fuse with their neighbours),
  // integer data, or a NaN bound (which Max / Min propagate, as numpy.clip does).
  if (!lo_v && !hi_v) return Emit(n, "Identity", {x}, {}, true).status();
  Value* y = x;
  if (lo_v) { GF_ASSIGN_OR_RETURN(y, Emit(n, "Max", {y, lo_v}, {}, !hi_v)); }
  if (hi_v) { GF_ASSIGN_OR_RETURN(y, Emit(n, "Min", {y, hi_v}, {}, true)); }
  return Status::Ok();
}

Status EmitCast(NodeImport& n, DType to) {
  return Emit(n, "Cast", {n.inputs[0]}, {{"to", static_cast<int64_t>(to)}}, true).status();
}

Status ImportCast(NodeImport& n) {
  GF_RETURN_IF_ERROR(CheckOutputs(n, 1));
  GF_RETURN_IF_ERROR(RequireInputs(n, 1, 1));
  auto it = n.attrs.find("to");
  if (it == n.attrs.end() || !std::holds_alternative<int64_t>(it->second))
    return InvalidArgument("needs an int attribute 'to'");
  const int64_t to = std::get<int64_t>(it->second);
  if (to < INT32_MIN || to > INT32_MAX) return InvalidArgument("'to' = ", to, " is not an ONNX element type");
  GF_ASSIGN_OR_RETURN(DType dt, DTypeFromOnnx(static_cast<int32_t>(to)));
  return EmitCast(n, dt);
}

Status ImportCastLike(NodeImport& n) {
  GF_RETURN_IF_ERROR(CheckOutputs(n, 1));
  GF_RETURN_IF_ERROR(RequireInputs(n, 2, 2));
  return EmitCast(n, n.inputs[1]->dtype());
}

Status ImportDropout(NodeImport& n) {
  GF_RETURN_IF_ERROR(RequireInputs(n, 1, 3));
  GF_RETURN_IF_ERROR(CheckOutputs(n, 2));
  const bool has_ratio = n.inputs.size() > 1 && n.inputs[1] && n.inputs[1]->constant() &&
                         n.inputs[1]->constant()->numel() == 1;
  const double ratio = has_ratio ? n.inputs[1]->constant()->GetAsDouble(0) : 0.5;
  if (n.inputs.size() > 2 && n.inputs[2]) {
    GF_ASSIGN_OR_RETURN(double mode, ConstantScalar(n, 2, "training_mode"));
    // Training with ratio 0 keeps every element: the inference form.
    if (mode != 0 && !(has_ratio && ratio == 0))
      return Unimplemented("training-mode Dropout is not supported (only inference, or a ratio of 0)");
  }
  // In inference the ratio does not matter; it is kept when valid so the IR shows it.
  AttributeMap a{{"training", int64_t{0}}};
  if (has_ratio && ratio >= 0 && ratio < 1) a["alpha"] = static_cast<float>(ratio);
  if (const std::string mask = OnnxOutput(n, 1); !mask.empty()) {
    // Nothing is dropped: the mask is all true, a constant of x's shape.
    Value* x = n.inputs[0];
    if (x->numel() > (int64_t{64} << 20))
      return Unimplemented("the mask output of Dropout on ", x->TypeString(), " (a constant over 64 MiB)");
    GF_ASSIGN_OR_RETURN(Tensor ones, Tensor::Empty(DType::kBool, x->shape()));
    if (ones.nbytes() > 0) std::memset(ones.data(), 1, ones.nbytes());
    GF_RETURN_IF_ERROR(n.g.AddConstant(mask, std::make_shared<const Tensor>(std::move(ones))).status());
  }
  return Emit(n, "Dropout", {n.inputs[0]}, std::move(a), true).status();
}

// LeakyRelu, HardSigmoid, Elu, Selu: ONNX's alpha/beta (Selu: alpha/gamma) attributes with
// ONNX's defaults (the table row's).
Status ImportAlphaBeta(NodeImport& n) {
  GF_RETURN_IF_ERROR(CheckOutputs(n, 1));
  GF_RETURN_IF_ERROR(RequireInputs(n, 1, 1));
  float alpha = n.args.alpha, beta = n.args.beta;
  auto get = [&](const char* k, float def) -> Result<float> {
    auto it = n.attrs.find(k);
    if (it == n.attrs.end()) return def;
    if (!std::holds_alternative<float>(it->second)) return InvalidArgument("attribute '", k, "' must be a float");
    return std::get<float>(it->second);
  };
  GF_ASSIGN_OR_RETURN(alpha, get("alpha", alpha));
  AttributeMap a{{"alpha", alpha}};
  if (n.args.beta_attr) {
    GF_ASSIGN_OR_RETURN(beta, get(n.args.beta_attr, beta));
    a["beta"] = beta;
  }
  return Emit(n, n.op(), {n.inputs[0]}, std::move(a), true).status();
}

// Max, Min, Sum, Mean over one or more inputs: the row's pairwise op folded over them (Mean:
// their sum divided by the count).
Status ImportVariadic(NodeImport& n) {
  GF_RETURN_IF_ERROR(CheckOutputs(n, 1));
  if (n.inputs.empty()) return InvalidArgument("needs at least one input");
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (!n.inputs[i]) return InvalidArgument("input ", i, " is empty");
  const bool mean = n.args.mean;
  const std::string bin = n.args.binary;
  if (n.inputs.size() == 1) return Emit(n, "Identity", {n.inputs[0]}, {}, true).status();
  Value* acc = n.inputs[0];
  for (size_t i = 1; i < n.inputs.size(); ++i) {
    const bool last = i + 1 == n.inputs.size() && !mean;
    GF_ASSIGN_OR_RETURN(acc, Emit(n, bin, {acc, n.inputs[i]}, {}, last));
  }
  if (!mean) return Status::Ok();
  if (!IsFloat(acc->dtype())) return Unimplemented("Mean on ", DTypeName(acc->dtype()), " is not supported");
  GF_ASSIGN_OR_RETURN(Value * count, ScalarConstant(n, acc->dtype(), static_cast<double>(n.inputs.size())));
  return Emit(n, "Div", {acc, count}, {}, true).status();
}

// LessOrEqual / GreaterOrEqual: the row's strict comparison OR equality.
Status ImportOrEqual(NodeImport& n) {
  GF_RETURN_IF_ERROR(CheckOutputs(n, 1));
  GF_RETURN_IF_ERROR(RequireInputs(n, 2, 2));
  const std::string strict = n.args.binary;
  GF_ASSIGN_OR_RETURN(Value * s, Emit(n, strict, {n.inputs[0], n.inputs[1]}, {}, false));
  GF_ASSIGN_OR_RETURN(Value * e, Emit(n, "Equal", {n.inputs[0], n.inputs[1]}, {}, false));
  return Emit(n, "Or", {s, e}, {}, true).status();
}

Status ImportXor(NodeImport& n) {
  GF_RETURN_IF_ERROR(CheckOutputs(n, 1));
  GF_RETURN_IF_ERROR(RequireInputs(n, 2, 2));
  GF_ASSIGN_OR_RETURN(Value * e, Emit(n, "Equal", {n.inputs[0], n.inputs[1]}, {}, false));
  return Emit(n, "Not", {e}, {}, true).status();
}

Status ImportPRelu(NodeImport& n) {
  GF_RETURN_IF_ERROR(CheckOutputs(n, 1));
  GF_RETURN_IF_ERROR(RequireInputs(n, 2, 2));
  Value* x = n.inputs[0];
  if (!IsFloat(x->dtype())) return Unimplemented("PRelu on ", DTypeName(x->dtype()), " inputs is not supported");
  GF_ASSIGN_OR_RETURN(Value * zero, ScalarConstant(n, x->dtype(), 0.0));
  GF_ASSIGN_OR_RETURN(Value * neg, Emit(n, "Less", {x, zero}, {}, false));
  GF_ASSIGN_OR_RETURN(Value * scaled, Emit(n, "Mul", {x, n.inputs[1]}, {}, false));
  return Emit(n, "Where", {neg, scaled, x}, {}, true).status();
}

Status ImportHardSwish(NodeImport& n) {
  GF_RETURN_IF_ERROR(CheckOutputs(n, 1));
  GF_RETURN_IF_ERROR(RequireInputs(n, 1, 1));
  AttributeMap a{{"alpha", 1.f / 6.f}, {"beta", 0.5f}};
  GF_ASSIGN_OR_RETURN(Value * hs, Emit(n, "HardSigmoid", {n.inputs[0]}, std::move(a), false));
  return Emit(n, "Mul", {n.inputs[0], hs}, {}, true).status();
}

Status ImportPow(NodeImport& n) {
  GF_RETURN_IF_ERROR(CheckOutputs(n, 1));
  GF_RETURN_IF_ERROR(RequireInputs(n, 2, 2));
  Value* x = n.inputs[0];
  Value* y = n.inputs[1];
  if (!IsFloat(x->dtype()) && IsFloat(y->dtype())) {
    // An integer base with a float exponent: the power of reals, truncated to x's type.
    GF_ASSIGN_OR_RETURN(Value * xf, Emit(n, "Cast", {x}, {{"to", static_cast<int64_t>(DType::kF32)}}, false));
    Value* yf = y;
    if (y->dtype() != DType::kF32) {
      GF_ASSIGN_OR_RETURN(yf, Emit(n, "Cast", {y}, {{"to", static_cast<int64_t>(DType::kF32)}}, false));
    }
    GF_ASSIGN_OR_RETURN(Value * p, Emit(n, "Pow", {xf, yf}, {}, false));
    return Emit(n, "Cast", {p}, {{"to", static_cast<int64_t>(x->dtype())}}, true).status();
  }
  if (y->dtype() != x->dtype()) {
    GF_ASSIGN_OR_RETURN(y, Emit(n, "Cast", {y}, {{"to", static_cast<int64_t>(x->dtype())}}, false));
  }
  return Emit(n, "Pow", {x, y}, {}, true).status();
}

Status ImportGelu(NodeImport& n) {
  GF_RETURN_IF_ERROR(CheckOutputs(n, 1));
  GF_RETURN_IF_ERROR(RequireInputs(n, 1, 1));
  std::string approx = "none";
  if (auto it = n.attrs.find("approximate"); it != n.attrs.end()) {
    if (!std::holds_alternative<std::string>(it->second)) return InvalidArgument("'approximate' must be a string");
    approx = std::get<std::string>(it->second);
  }
  if (approx != "none" && approx != "tanh") return InvalidArgument("approximate='", approx, "' is not 'none' or 'tanh'");
  return Emit(n, approx == "tanh" ? "GeluTanh" : "Gelu", {n.inputs[0]}, {}, true).status();
}

// Split before opset 18 splits into as many equal parts as the node has outputs when it has
// no 'split' input; the IR's Split (opset 18 form) reads that count from 'num_outputs'.
// (ONNX 13-17 has no num_outputs attribute: one in the model is ignored, not trusted.)
Status ImportSplit(NodeImport& n) {
  const bool has_split = n.inputs.size() > 1 && n.inputs[1];
  if (n.opset < 18) n.attrs.erase("num_outputs");
  if (!has_split && !n.attrs.count("num_outputs"))
    n.attrs["num_outputs"] = static_cast<int64_t>(n.proto.output_size());
  const OpSchema* s = FindSchema("Split");
  if (!s) return Unimplemented("op not supported");
  return ImportDirect(n, *s);
}

// Einsum: the ops of its lowering (src/onnx/einsum.h), the last one named as the ONNX node.
Status ImportEinsum(NodeImport& n) {
  GF_RETURN_IF_ERROR(CheckOutputs(n, 1));
  if (n.inputs.empty()) return InvalidArgument("needs at least one input");
  std::vector<Shape> shapes;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (!n.inputs[i]) return InvalidArgument("input ", i, " is empty");
    shapes.push_back(n.inputs[i]->shape());
  }
  auto eq = n.attrs.find("equation");
  if (eq == n.attrs.end() || !std::holds_alternative<std::string>(eq->second))
    return InvalidArgument("needs a string attribute 'equation'");
  GF_ASSIGN_OR_RETURN(std::vector<EinsumStep> steps, LowerEinsum(std::get<std::string>(eq->second), shapes));
  if (steps.empty()) return Emit(n, "Identity", {n.inputs[0]}, {}, true).status();
  std::vector<Value*> values = n.inputs;  // operands, then each step's output
  for (size_t k = 0; k < steps.size(); ++k) {
    std::vector<Value*> ins;
    for (int i : steps[k].inputs) ins.push_back(values[static_cast<size_t>(i)]);
    if (op::FromName(steps[k].op) == op::Reshape) {
      GF_ASSIGN_OR_RETURN(Value * shape, Int64sConstant(n, "shape", steps[k].shape));
      ins.push_back(shape);
    }
    GF_ASSIGN_OR_RETURN(Value * v, Emit(n, steps[k].op, ins, steps[k].attrs, k + 1 == steps.size()));
    values.push_back(v);
  }
  return Status::Ok();
}

// The importer's table: the ONNX ops that are not the IR op of the same name with ONNX's
// inputs, attributes and outputs, each with the conversion that builds it and its arguments.
struct Conversion {
  const char* op;
  ConvertFn fn;
  ConversionArgs args = {};
};
constexpr Conversion kConversions[] = {
    {"Constant", ImportConstant},
    {"Clip", ImportClip},
    {"Cast", ImportCast},
    {"CastLike", ImportCastLike},
    {"Dropout", ImportDropout},
    {"LeakyRelu", ImportAlphaBeta, {.alpha = 0.01f}},
    {"HardSigmoid", ImportAlphaBeta, {.alpha = 0.2f, .beta = 0.5f, .beta_attr = "beta"}},
    {"Elu", ImportAlphaBeta, {.alpha = 1.f}},
    {"Selu", ImportAlphaBeta,
     {.alpha = 1.67326319217681884765625f, .beta = 1.05070102214813232421875f, .beta_attr = "gamma"}},
    {"Max", ImportVariadic, {.binary = "Max"}},
    {"Min", ImportVariadic, {.binary = "Min"}},
    {"Sum", ImportVariadic, {.binary = "Add"}},
    {"Mean", ImportVariadic, {.binary = "Add", .mean = true}},
    {"LessOrEqual", ImportOrEqual, {.binary = "Less"}},
    {"GreaterOrEqual", ImportOrEqual, {.binary = "Greater"}},
    {"Xor", ImportXor},
    {"PRelu", ImportPRelu},
    {"HardSwish", ImportHardSwish},
    {"Pow", ImportPow},
    {"Gelu", ImportGelu},
    {"Split", ImportSplit},
    {"Einsum", ImportEinsum},
    {"Attention", ImportAttention},
    {"RotaryEmbedding", ImportRotaryEmbedding},
    {"RMSNormalization", ImportRmsNormalization},
    {"Swish", ImportSwish},
};

// The 1:1 path: the registry has the op with ONNX's inputs, attributes and outputs.
Status ImportDirect(NodeImport& n, const OpSchema& s) {
  std::vector<Value*> ins = n.inputs;
  while (!ins.empty() && !ins.back()) ins.pop_back();  // trailing omitted inputs == absent
  if (static_cast<int>(ins.size()) > s.max_inputs || static_cast<int>(ins.size()) < s.min_inputs)
    return InvalidArgument("takes ", s.min_inputs, "..", s.max_inputs, " inputs, got ", ins.size());
  for (int i = 0; i < s.min_inputs; ++i)
    if (!ins[i]) return InvalidArgument("input ", i, " is required");
  // Trailing unnamed outputs are not requested; the rest must be computable.
  int asked = n.proto.output_size();
  while (asked > 0 && n.proto.output(asked - 1).empty()) --asked;
  if (asked == 0) return InvalidArgument("has no outputs");
  int count = s.num_outputs < 0 ? asked : s.num_outputs;
  if (asked > count) GF_RETURN_IF_ERROR(CheckOutputs(n, count));
  std::vector<std::string> names;
  for (int k = 0; k < count; ++k) {
    std::string o = OnnxOutput(n, k);
    names.push_back(o.empty() ? n.g.FreshName(n.name + "/unused") : o);
  }
  if (s.elementwise) GF_RETURN_IF_ERROR(CheckFloatOnly(s.name, ins));
  // Fold as we build: shape-only subgraphs (Shape -> Gather -> Concat -> Reshape) become
  // constants before the ops that need constant shape inputs are added.
  GF_ASSIGN_OR_RETURN(Node * node, n.g.AddNode(n.op(), ins, n.attrs, n.name, count, names));
  return FoldNodeIfConstant(n.g, node, ImportFold()).status().WithContext(node->Describe());
}

}  // namespace

const std::string& NodeImport::op() const { return proto.op_type(); }
std::string NodeImport::Describe() const { return StrCat("node '", name, "' (", proto.op_type(), ")"); }

Result<Attribute> ConvertAttribute(const onnx::AttributeProto& a, const std::string& what) {
  if (!a.ref_attr_name().empty())
    return Unimplemented(what, " refers to a function attribute (functions are not supported)");
  auto type = a.type();
  if (type == onnx::AttributeProto::UNDEFINED) {  // IR < 4 models may leave the type out
    if (a.has_f()) type = onnx::AttributeProto::FLOAT;
    else if (a.has_i()) type = onnx::AttributeProto::INT;
    else if (a.has_s()) type = onnx::AttributeProto::STRING;
    else if (a.has_t()) type = onnx::AttributeProto::TENSOR;
    else if (a.has_g() || a.graphs_size()) type = onnx::AttributeProto::GRAPH;
    else if (a.floats_size()) type = onnx::AttributeProto::FLOATS;
    else if (a.ints_size()) type = onnx::AttributeProto::INTS;
    else return InvalidArgument(what, " has no type and no value");
  }
  switch (type) {
    case onnx::AttributeProto::FLOAT: return Attribute(a.f());
    case onnx::AttributeProto::INT: return Attribute(static_cast<int64_t>(a.i()));
    case onnx::AttributeProto::STRING: return Attribute(a.s());
    case onnx::AttributeProto::INTS:
      return Attribute(std::vector<int64_t>(a.ints().begin(), a.ints().end()));
    case onnx::AttributeProto::FLOATS: return Attribute(std::vector<float>(a.floats().begin(), a.floats().end()));
    case onnx::AttributeProto::TENSOR: {
      GF_ASSIGN_OR_RETURN(Tensor t, TensorFromProto(a.t(), what));
      return Attribute(std::make_shared<const Tensor>(std::move(t)));
    }
    case onnx::AttributeProto::GRAPH:
    case onnx::AttributeProto::GRAPHS:
      return Unimplemented(what, " holds a subgraph (control flow is not supported)");
    default:
      return Unimplemented(what, " has type ", onnx::AttributeProto::AttributeType_Name(type),
                           ", which is not supported");
  }
}

namespace {

// A constant input made from an attribute of an older opset's form.
Result<Value*> AttributeInput(NodeImport& n, const std::string& what, std::shared_ptr<const Tensor> data) {
  return n.g.AddConstant(n.g.FreshName(StrCat(n.name, "/", what)), std::move(data));
}

// The ints attribute `attr` of an older opset's form as a constant input (the attribute goes).
Result<Value*> IntsInput(NodeImport& n, const std::string& attr) {
  const std::vector<int64_t> v = AttrInts(n.attrs, attr, {});
  n.attrs.erase(attr);
  return Int64sConstant(n, attr, v);
}

// Rewrites a node of an opset outside 13-17 whose form differs into that form (see the table at
// the top). Sets *done when it added the node's IR itself.
// ONNX's TensorProto.DataType by name, for Cast's string `to` before opset 6.
Result<int64_t> OnnxTypeByName(const std::string& name) {
  static const std::pair<const char*, int64_t> kTypes[] = {
      {"FLOAT", 1}, {"UINT8", 2}, {"INT8", 3},  {"UINT16", 4}, {"INT16", 5},   {"INT32", 6},   {"INT64", 7},
      {"STRING", 8}, {"BOOL", 9}, {"FLOAT16", 10}, {"DOUBLE", 11}, {"UINT32", 12}, {"UINT64", 13}, {"BFLOAT16", 16}};
  for (const auto& [n, v] : kTypes)
    if (name == n) return v;
  return InvalidArgument("Cast: 'to' is '", name, "', not an ONNX element type name");
}

// Opsets 1-6: the forms that changed at opset 7 or earlier.
//   every op                 consumed_inputs (a legacy optimization hint) is dropped
//   binary arithmetic, logic  broadcast=1 with `axis`: B aligned with A's dims from `axis` on,
//   and comparisons           made numpy-style by reshaping B (trailing 1s); without `axis` B is
//                            A's suffix, which numpy broadcasting already means
//   Gemm                     broadcast is dropped (C broadcasts as numpy's rule allows)
//   Cast < 6                 `to` as a type name -> the element type number
//   Reshape < 5              the `shape` attribute -> a constant input
//   Concat < 4               `axis` defaults to 1
//   Pad < 2                  `paddings` is `pads`
//   Dropout < 7              is_test is dropped (inference either way), ratio stays an attribute
//   Tile < 6                 (tiles, axis) inputs: refused
Status UpgradeBefore7(NodeImport& n) {
  const op::Id op = n.id;
  n.attrs.erase("consumed_inputs");
  // The ONNX ops with legacy broadcasting (Xor among them, which the IR builds from others).
  static constexpr std::string_view kBroadcastOps[] = {"Add", "Sub", "Mul",   "Div",     "Pow", "And",
                                                       "Or",  "Xor", "Equal", "Greater", "Less"};
  if (std::find(std::begin(kBroadcastOps), std::end(kBroadcastOps), n.op()) != std::end(kBroadcastOps)) {
    const bool broadcast = AttrInt(n.attrs, "broadcast", 0) != 0;
    const bool has_axis = n.attrs.count("axis") != 0;
    const int64_t axis = AttrInt(n.attrs, "axis", 0);
    n.attrs.erase("broadcast");
    n.attrs.erase("axis");
    if (!broadcast || !has_axis || n.inputs.size() != 2 || !n.inputs[0] || !n.inputs[1]) return Status::Ok();
    const Shape& a = n.inputs[0]->shape();
    const Shape& b = n.inputs[1]->shape();
    const int64_t rank = static_cast<int64_t>(a.size());
    const int64_t at = axis < 0 ? axis + rank : axis;
    if (at < 0 || at + static_cast<int64_t>(b.size()) > rank)
      return InvalidArgument("broadcast axis ", axis, " does not place ", n.inputs[1]->TypeString(), " inside ",
                             n.inputs[0]->TypeString());
    if (at + static_cast<int64_t>(b.size()) == rank) return Status::Ok();  // a suffix: numpy's alignment
    Shape aligned = b;
    aligned.resize(static_cast<size_t>(rank - at), 1);
    GF_ASSIGN_OR_RETURN(Value * shape, Int64sConstant(n, "broadcast_shape", aligned));
    GF_ASSIGN_OR_RETURN(n.inputs[1], Emit(n, "Reshape", {n.inputs[1], shape}, {}, false));
    return Status::Ok();
  }
  if (op == op::Gemm) n.attrs.erase("broadcast");
  if (op == op::Dropout) n.attrs.erase("is_test");
  if (op == op::Cast) {
    auto to = n.attrs.find("to");
    if (to != n.attrs.end() && std::holds_alternative<std::string>(to->second)) {
      GF_ASSIGN_OR_RETURN(int64_t t, OnnxTypeByName(std::get<std::string>(to->second)));
      to->second = t;
    }
  }
  if (op == op::Reshape && n.opset < 5 && n.attrs.count("shape")) {
    n.inputs.resize(1);
    GF_ASSIGN_OR_RETURN(Value * shape, IntsInput(n, "shape"));
    n.inputs.push_back(shape);
  }
  if (op == op::Concat && n.opset < 4 && !n.attrs.count("axis")) n.attrs["axis"] = int64_t{1};
  if (op == op::Pad && n.opset < 2) {
    auto p = n.attrs.find("paddings");
    if (p != n.attrs.end()) {
      n.attrs["pads"] = p->second;
      n.attrs.erase("paddings");
    }
  }
  if (op == op::Tile && n.opset < 6) return Unimplemented("Tile before opset 6 (tiles and axis inputs) is not supported");
  return Status::Ok();
}

Status UpgradeForm(NodeImport& n, bool* done) {
  *done = false;
  const op::Id op = n.id;
  if (n.opset < 7) GF_RETURN_IF_ERROR(UpgradeBefore7(n));
  if (n.opset < 13 && (op == op::Softmax || op == op::LogSoftmax)) {
    GF_RETURN_IF_ERROR(RequireInputs(n, 1, 1));
    GF_RETURN_IF_ERROR(CheckOutputs(n, 1));
    Value* x = n.inputs[0];
    const int64_t rank = static_cast<int64_t>(x->shape().size());
    int64_t axis = AttrInt(n.attrs, "axis", 1);
    if (axis < -rank || axis >= std::max<int64_t>(rank, 1))
      return InvalidArgument("axis ", axis, " is out of range for ", x->TypeString());
    if (axis < 0) axis += rank;
    if (rank == 0 || axis == rank - 1) {
      n.attrs["axis"] = int64_t{-1};
      return Status::Ok();
    }
    // Over every axis from `axis` on, as one: flatten them, normalize, restore the shape.
    GF_ASSIGN_OR_RETURN(Value * flat, Emit(n, "Flatten", {x}, {{"axis", axis}}, false));
    GF_ASSIGN_OR_RETURN(Value * soft, Emit(n, n.op(), {flat}, {{"axis", int64_t{-1}}}, false));
    GF_ASSIGN_OR_RETURN(Value * s, Int64sConstant(n, "shape", x->shape()));
    GF_RETURN_IF_ERROR(Emit(n, "Reshape", {soft, s}, {}, true).status());
    *done = true;
    return Status::Ok();
  }
  if (n.opset < 11 && op == op::Clip) {
    GF_RETURN_IF_ERROR(RequireInputs(n, 1, 1));
    Value* x = n.inputs[0];
    n.inputs.resize(3, nullptr);
    for (const auto& [attr, k] : {std::pair<const char*, size_t>{"min", 1}, {"max", 2}}) {
      if (!n.attrs.count(attr)) continue;
      GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(x->dtype(), {}));
      t.SetFromDouble(0, AttrFloat(n.attrs, attr, 0.f));
      n.attrs.erase(attr);
      GF_ASSIGN_OR_RETURN(n.inputs[k], AttributeInput(n, attr, std::make_shared<const Tensor>(std::move(t))));
    }
    return Status::Ok();
  }
  if (n.opset < 10 && op == op::Slice) {
    GF_RETURN_IF_ERROR(RequireInputs(n, 1, 1));
    const bool has_axes = n.attrs.count("axes") != 0;
    n.inputs.resize(has_axes ? 4 : 3, nullptr);
    GF_ASSIGN_OR_RETURN(n.inputs[1], IntsInput(n, "starts"));
    GF_ASSIGN_OR_RETURN(n.inputs[2], IntsInput(n, "ends"));
    if (has_axes) { GF_ASSIGN_OR_RETURN(n.inputs[3], IntsInput(n, "axes")); }
    return Status::Ok();
  }
  if (n.opset < 11 && op == op::Pad) {
    GF_RETURN_IF_ERROR(RequireInputs(n, 1, 1));
    if (!n.attrs.count("pads")) return InvalidArgument("Pad before opset 11 needs a 'pads' attribute");
    Value* x = n.inputs[0];
    n.inputs.resize(3, nullptr);
    GF_ASSIGN_OR_RETURN(n.inputs[1], IntsInput(n, "pads"));
    if (n.attrs.count("value")) {
      GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(x->dtype(), {}));
      t.SetFromDouble(0, AttrFloat(n.attrs, "value", 0.f));
      n.attrs.erase("value");
      GF_ASSIGN_OR_RETURN(n.inputs[2], AttributeInput(n, "value", std::make_shared<const Tensor>(std::move(t))));
    }
    return Status::Ok();
  }
  if (n.opset < 10 && op == op::TopK) {
    GF_RETURN_IF_ERROR(RequireInputs(n, 1, 1));
    auto k = n.attrs.find("k");
    if (k == n.attrs.end() || !std::holds_alternative<int64_t>(k->second))
      return InvalidArgument("TopK before opset 10 needs an int attribute 'k'");
    const int64_t value = std::get<int64_t>(k->second);
    n.attrs.erase(k);
    n.inputs.resize(2);
    GF_ASSIGN_OR_RETURN(n.inputs[1], Int64sConstant(n, "k", {value}));
    return Status::Ok();
  }
  return Status::Ok();
}

}  // namespace

Status ImportNode(NodeImport& n) {
  const std::string& domain = n.proto.domain();
  if (!domain.empty() && domain != "ai.onnx")
    return Unimplemented("op domain '", domain, "' is not supported (only the default ONNX domain)");
  ConvertFn convert = nullptr;
  n.id = op::FromName(n.op());
  for (const Conversion& c : kConversions)
    if (n.op() == c.op) convert = c.fn, n.args = c.args;
  const OpSchema* schema = convert ? nullptr : FindSchema(n.op());
  if (!convert && !schema) return Unimplemented("op not supported");
  for (const onnx::AttributeProto& a : n.proto.attribute()) {
    const std::string what = StrCat("attribute '", a.name(), "'");
    if (n.attrs.count(a.name())) return InvalidArgument(what, " appears twice");
    GF_ASSIGN_OR_RETURN(n.attrs[a.name()], ConvertAttribute(a, what));
  }
  if (n.opset < 13 || n.opset > 17) {
    bool done = false;
    GF_RETURN_IF_ERROR(UpgradeForm(n, &done));
    if (done) return Status::Ok();
  }
  return convert ? convert(n) : ImportDirect(n, *schema);
}

}  // namespace graphfuse::onnx_import
