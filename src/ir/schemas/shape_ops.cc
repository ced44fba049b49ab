// Shape manipulation (ONNX opsets 13-17): inference. The kernels of the ops that are not views
// are in src/cpu/kernels/shape_ops.cc.
//   Views (no kernel; an executor aliases output 0 to input 0's buffer):
//     Reshape (opset 14: 0 copies the input dim unless allowzero, one -1 inferred),
//     Flatten (axis default 1), Squeeze / Unsqueeze (axes as an input from opset 13), Identity.
//   Data producers (kernels, also run by constant folding):
//     Shape (opset 15 start/end), Size (the element count), ConstantOfShape (value attribute,
//     default f32 0),
//     Constant (value / value_float / value_floats / value_int / value_ints), Range.
// Output shapes that depend on input values need those inputs to be constants.
#include "ir/schemas/shape_ops.h"

#include <cmath>
#include <vector>

#include "ir/schemas/infer_util.h"
#include "ir/schemas/schema_lists.h"

namespace graphfuse::schemas {

std::pair<int64_t, int64_t> ShapeRange(int64_t rank, int64_t start, int64_t end) {
  auto fix = [rank](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + rank : v, 0, rank); };
  start = fix(start), end = fix(end);
  return {start, std::max(end, start)};
}

Result<const Tensor*> FillValue(const AttributeMap& attrs, const std::string& where) {
  auto it = attrs.find("value");
  if (it == attrs.end()) return static_cast<const Tensor*>(nullptr);  // f32 0
  const auto* t = std::get_if<std::shared_ptr<const Tensor>>(&it->second);
  if (t == nullptr || *t == nullptr || (*t)->numel() != 1)
    return InvalidArgument(where, ": the 'value' attribute must be a tensor of one element");
  return t->get();
}

// The tensor a Constant node produces, from whichever value attribute it has.
Result<std::shared_ptr<const Tensor>> ConstantValue(const AttributeMap& attrs, const std::string& where) {
  static const char* const kKeys[] = {"value", "value_float", "value_floats", "value_int", "value_ints"};
  const Attribute* found = nullptr;
  std::string key;
  for (const auto& [k, a] : attrs) {
    bool known = false;
    for (const char* name : kKeys) known |= k == name;
    if (!known) {
      if (k.rfind("value", 0) == 0 || k == "sparse_value")
        return Unimplemented(where, ": Constant attribute '", k, "' is not supported");
      continue;
    }
    if (found) return InvalidArgument(where, ": Constant needs exactly one value attribute, got '", key, "' and '", k, "'");
    found = &a;
    key = k;
  }
  if (!found) return InvalidArgument(where, ": Constant needs a value attribute (value, value_float, value_ints, ...)");
  auto make = [&](DType t, const Shape& s, auto fill) -> Result<std::shared_ptr<const Tensor>> {
    GF_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(t, s));
    fill(out);
    return std::shared_ptr<const Tensor>(std::make_shared<Tensor>(std::move(out)));
  };
  if (key == "value") {
    const auto* t = std::get_if<std::shared_ptr<const Tensor>>(found);
    if (!t || !*t) return InvalidArgument(where, ": Constant 'value' must be a tensor");
    return *t;
  }
  if (key == "value_float" || key == "value_int") {
    double v;
    if (const float* f = std::get_if<float>(found)) v = *f;
    else if (const int64_t* i = std::get_if<int64_t>(found)) v = static_cast<double>(*i);
    else return InvalidArgument(where, ": Constant '", key, "' must be a number");
    if (key == "value_float") return make(DType::kF32, {}, [&](Tensor& t) { t.data_as<float>()[0] = static_cast<float>(v); });
    const int64_t iv = std::get_if<int64_t>(found) ? *std::get_if<int64_t>(found) : static_cast<int64_t>(v);
    return make(DType::kI64, {}, [&](Tensor& t) { t.data_as<int64_t>()[0] = iv; });
  }
  if (key == "value_floats") {
    const auto* fs = std::get_if<std::vector<float>>(found);
    if (!fs) return InvalidArgument(where, ": Constant 'value_floats' must be a list of floats");
    return make(DType::kF32, {static_cast<int64_t>(fs->size())},
                [&](Tensor& t) { std::copy(fs->begin(), fs->end(), t.data_as<float>()); });
  }
  const auto* is = std::get_if<std::vector<int64_t>>(found);
  if (!is) return InvalidArgument(where, ": Constant 'value_ints' must be a list of ints");
  return make(DType::kI64, {static_cast<int64_t>(is->size())},
              [&](Tensor& t) { std::copy(is->begin(), is->end(), t.data_as<int64_t>()); });
}

Result<RangeArgs> ReadRangeArgs(const TensorView (&in)[3], const std::string& where) {
  static const char* const kNames[] = {"start", "limit", "delta"};
  RangeArgs a{};
  for (int k = 0; k < 3; ++k) {
    if (in[k].numel() != 1)
      return InvalidArgument(where, ": Range ", kNames[k], " must be a scalar, got ", ShapeToString(in[k].shape));
    a.f[k] = LoadAsDouble(in[k], 0);
    a.i[k] = in[k].dtype == DType::kI64 ? in[k].as<const int64_t>()[0]
             : in[k].dtype == DType::kI32 ? in[k].as<const int32_t>()[0] : 0;
  }
  return a;
}

namespace {

std::vector<ValueType> Same(const Value* x, Shape shape) { return {{x->dtype(), std::move(shape)}}; }

// ---- views ----

Result<std::vector<ValueType>> InferReshape(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  GF_ASSIGN_OR_RETURN(auto shape, RequireConstInts(ctx, 1, "shape"));
  const bool allowzero = ctx.GetInt("allowzero", 0) != 0;
  const std::string spec = ShapeToString(shape);
  int infer_at = -1;
  bool has_zero = false;
  Shape out(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t v = shape[i];
    if (v == -1) {
      if (infer_at >= 0) return InvalidArgument(ctx.Describe(), ": shape ", spec, " has more than one -1");
      infer_at = static_cast<int>(i);
    } else if (v == 0 && !allowzero) {
      if (i >= x->shape().size())
        return InvalidArgument(ctx.Describe(), ": shape ", spec, " copies dim ", i, " (0) but the input ",
                               ShapeToString(x->shape()), " has rank ", x->shape().size());
      v = x->shape()[i];
    } else if (v < 0) {
      return InvalidArgument(ctx.Describe(), ": shape ", spec, " has invalid dim ", v);
    }
    has_zero |= shape[i] == 0;
    out[i] = v;
  }
  if (allowzero && has_zero && infer_at >= 0)
    return InvalidArgument(ctx.Describe(), ": shape ", spec, " has both 0 and -1, which allowzero=1 forbids");
  const int64_t total = Product(x->shape());
  if (infer_at >= 0) {
    out[infer_at] = 1;
    auto known_or = NumElements(out);
    if (!known_or.ok()) return known_or.status().WithContext(ctx.Describe());
    const int64_t known = *known_or;
    if (known == 0 || total % known != 0)
      return InvalidArgument(ctx.Describe(), ": cannot infer the -1 of shape ", spec, " for input ",
                             ShapeToString(x->shape()), " (", total, " elements)");
    out[infer_at] = total / known;
  }
  auto count = NumElements(out);
  if (!count.ok()) return count.status().WithContext(ctx.Describe());
  if (*count != total)
    return InvalidArgument(ctx.Describe(), ": cannot reshape ", ShapeToString(x->shape()), " (", total,
                           " elements) to ", ShapeToString(out), " (", *count, " elements)");
  return Same(x, out);
}

Result<std::vector<ValueType>> InferFlatten(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  const int64_t rank = static_cast<int64_t>(x->shape().size());
  int64_t axis = ctx.GetInt("axis", 1);
  if (axis < -rank || axis > rank)
    return InvalidArgument(ctx.Describe(), ": axis ", axis, " is out of range [", -rank, ", ", rank, "]");
  if (axis < 0) axis += rank;
  const size_t a = static_cast<size_t>(axis);
  return Same(x, {Product(x->shape(), 0, a), Product(x->shape(), a, x->shape().size())});
}

Result<std::vector<ValueType>> InferSqueeze(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  const Shape& in = x->shape();
  const int64_t rank = static_cast<int64_t>(in.size());
  std::vector<bool> drop(in.size(), false);
  if (ctx.input(1) != nullptr || ctx.HasAttr("axes")) {
    std::vector<int64_t> axes = ctx.GetInts("axes");  // opset 11 form
    if (ctx.input(1) != nullptr) {
      GF_ASSIGN_OR_RETURN(axes, RequireConstInts(ctx, 1, "axes"));
    }
    GF_ASSIGN_OR_RETURN(auto norm, NormalizeAxes(ctx, axes, rank));
    for (int64_t a : norm) {
      if (in[a] != 1)
        return InvalidArgument(ctx.Describe(), ": cannot squeeze axis ", a, " of size ", in[a]);
      drop[a] = true;
    }
  } else {
    for (size_t i = 0; i < in.size(); ++i) drop[i] = in[i] == 1;
  }
  Shape out;
  for (size_t i = 0; i < in.size(); ++i)
    if (!drop[i]) out.push_back(in[i]);
  return Same(x, out);
}

Result<std::vector<ValueType>> InferUnsqueeze(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  std::vector<int64_t> axes = ctx.GetInts("axes");  // opset 11 form
  if (ctx.input(1) != nullptr || !ctx.HasAttr("axes")) {
    GF_ASSIGN_OR_RETURN(axes, RequireConstInts(ctx, 1, "axes"));
  }
  const int64_t out_rank = static_cast<int64_t>(x->shape().size() + axes.size());
  GF_ASSIGN_OR_RETURN(auto norm, NormalizeAxes(ctx, axes, out_rank));
  std::vector<bool> inserted(static_cast<size_t>(out_rank), false);
  for (int64_t a : norm) inserted[a] = true;
  Shape out;
  size_t k = 0;
  for (int64_t j = 0; j < out_rank; ++j) out.push_back(inserted[j] ? 1 : x->shape()[k++]);
  return Same(x, out);
}

Result<std::vector<ValueType>> InferIdentity(const InferContext& ctx) { return Same(ctx.input(0), ctx.input(0)->shape()); }

// ---- Shape ----

Result<std::vector<ValueType>> InferShape(const InferContext& ctx) {
  const int64_t rank = static_cast<int64_t>(ctx.input(0)->shape().size());
  auto [b, e] = ShapeRange(rank, ctx.GetInt("start", 0), ctx.GetInt("end", rank));
  return std::vector<ValueType>{{DType::kI64, Shape{e - b}}};
}

// ---- Size: the element count, an i64 scalar ----

Result<std::vector<ValueType>> InferSize(const InferContext& ctx) {
  return std::vector<ValueType>{{DType::kI64, Shape{}}};
}

// ---- ConstantOfShape ----

Result<std::vector<ValueType>> InferConstantOfShape(const InferContext& ctx) {
  GF_ASSIGN_OR_RETURN(auto shape, RequireConstInts(ctx, 0, "shape"));
  if (ctx.input(0)->shape().size() != 1)
    return InvalidArgument(ctx.Describe(), ": the shape input must be 1-D");
  for (int64_t d : shape)
    if (d < 0) return InvalidArgument(ctx.Describe(), ": shape ", ShapeToString(shape), " has a negative dim");
  GF_ASSIGN_OR_RETURN(const Tensor* v, FillValue(ctx.attrs, ctx.Describe()));
  GF_RETURN_IF_ERROR(NumElements(shape).status().WithContext(ctx.Describe()));
  return std::vector<ValueType>{{v ? v->dtype() : DType::kF32, shape}};
}

// ---- Constant ----

Result<std::vector<ValueType>> InferConstant(const InferContext& ctx) {
  GF_ASSIGN_OR_RETURN(auto t, ConstantValue(ctx.attrs, ctx.Describe()));
  return std::vector<ValueType>{{t->dtype(), t->shape()}};
}

// ---- Range ----

// max(ceil((limit - start) / delta), 0), computed in the input type as ONNX Runtime does.
Result<int64_t> RangeCount(DType t, const RangeArgs& a, const std::string& where) {
  if (a.f[2] == 0) return InvalidArgument(where, ": Range delta must not be 0");
  double n;
  if (t == DType::kF32) {
    n = std::ceil((static_cast<float>(a.f[1]) - static_cast<float>(a.f[0])) / static_cast<float>(a.f[2]));
  } else {
    const int64_t d = a.i[2];
    int64_t span;
    if (__builtin_sub_overflow(a.i[1], a.i[0], &span))
      return InvalidArgument(where, ": Range(", a.i[0], ", ", a.i[1], ", ", d, ") overflows int64");
    int64_t q = d == -1 ? -span : span / d;
    if (d != -1 && span % d != 0 && ((span > 0) == (d > 0))) ++q;
    n = static_cast<double>(q);
  }
  if (!(n == n) || n > static_cast<double>(int64_t{1} << 40))
    return InvalidArgument(where, ": Range(", a.f[0], ", ", a.f[1], ", ", a.f[2], ") has an absurd length");
  return static_cast<int64_t>(std::max(n, 0.0));
}

Result<std::vector<ValueType>> InferRange(const InferContext& ctx) {
  const DType t = ctx.input(0)->dtype();
  static const char* const kNames[] = {"start", "limit", "delta"};
  TensorView views[3];
  for (size_t i = 0; i < 3; ++i) {
    if (ctx.input(i)->dtype() != t || (t != DType::kF32 && t != DType::kI32 && t != DType::kI64))
      return InvalidArgument(ctx.Describe(), ": Range needs start, limit and delta of one dtype (f32, i32 or i64)");
    const Tensor* c = ctx.ConstInput(i);
    if (!c)
      return Unimplemented(ctx.Describe(), ": needs a constant ", kNames[i], " input (dynamic shapes are not supported)");
    views[i] = c->view();
  }
  GF_ASSIGN_OR_RETURN(RangeArgs a, ReadRangeArgs(views, ctx.Describe()));
  GF_ASSIGN_OR_RETURN(int64_t n, RangeCount(t, a, ctx.Describe()));
  return std::vector<ValueType>{{t, Shape{n}}};
}

}  // namespace

std::vector<OpSchema> ShapeOpSchemas() {
  return {
      {"Reshape", 2, 2, 1, InferReshape, /*view=*/true},
      {"Flatten", 1, 1, 1, InferFlatten, /*view=*/true},
      {"Squeeze", 1, 2, 1, InferSqueeze, /*view=*/true},
      {"Unsqueeze", 1, 2, 1, InferUnsqueeze, /*view=*/true},
      {"Identity", 1, 1, 1, InferIdentity, /*view=*/true},
      {"Shape", 1, 1, 1, InferShape},
      {"Size", 1, 1, 1, InferSize},
      {"ConstantOfShape", 1, 1, 1, InferConstantOfShape},
      {"Constant", 0, 0, 1, InferConstant},
      {"Range", 3, 3, 1, InferRange},
  };
}

}  // namespace graphfuse::schemas
