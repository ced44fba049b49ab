#include "ops/reference.h"

#include "ops/scalar_math.h"

namespace graphfuse {
namespace {
using namespace scalar;  // the table's vocabulary for T = double / int64_t

#define OP(name, arity, cls, ints, cost, ulp, alpha, beta, expr)                                 \
  struct name##Row {                                                                            \
    template <class T>                                                                          \
    static T Eval([[maybe_unused]] T x, [[maybe_unused]] T y, [[maybe_unused]] T z,             \
                  [[maybe_unused]] const OpAttrs& a, [[maybe_unused]] int64_t idx) {            \
      return expr;                                                                              \
    }                                                                                           \
  };
#include "graphfuse/ops.def"
#undef OP

constexpr bool kIntOk = true, kFloatOnly = false;

// Instantiates a row's integer form only for rows that have one.
template <class Row, bool kInts>
int64_t EvalIntRow(int64_t x, int64_t y, int64_t z, const OpAttrs& a, int64_t idx) {
  if constexpr (kInts) {
    return Row::template Eval<int64_t>(x, y, z, a, idx);
  } else {
    GF_CHECK(false, "op has no integer form");
    return 0;
  }
}

}  // namespace

double ReferenceScalar(OpKind kind, double x, double y, double z, const OpAttrs& a, int64_t idx) {
  switch (kind) {
#define OP(name, ...) \
  case OpKind::k##name: return name##Row::Eval<double>(x, y, z, a, idx);
#include "graphfuse/ops.def"
#undef OP
  }
  return 0;
}

int64_t ReferenceScalarInt(OpKind kind, int64_t x, int64_t y, int64_t z, const OpAttrs& a, int64_t idx) {
  switch (kind) {
#define OP(name, arity, cls, ints, ...) \
  case OpKind::k##name: return EvalIntRow<name##Row, ints>(x, y, z, a, idx);
#include "graphfuse/ops.def"
#undef OP
  }
  return 0;
}

bool ComputesInIntegers(OpKind kind, std::span<const DType> inputs) {
  const OpInfo& op = GetOpInfo(kind);
  const DType data = (op.cls == OpClass::kSelect) ? inputs[1] : inputs[0];
  return !IsFloat(data);
}

bool NeedsRoundingStep(OpKind kind, DType out, bool integer_domain) {
  if (!integer_domain) return out == DType::kF16 || out == DType::kBF16;
  return out == DType::kI32 && GetOpInfo(kind).cls == OpClass::kArith;
}

Result<std::vector<double>> ReferenceOp(OpKind kind, std::span<const TensorView> in, const OpAttrs& a) {
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  for (const TensorView& t : in) shapes.push_back(t.shape), dtypes.push_back(t.dtype);
  GF_ASSIGN_OR_RETURN(Shape out_shape, InferShape(kind, shapes));
  GF_RETURN_IF_ERROR(InferDType(kind, dtypes, a).status());
  GF_ASSIGN_OR_RETURN(int64_t n, NumElements(out_shape));
  const bool ints = ComputesInIntegers(kind, dtypes);

  std::vector<std::vector<int64_t>> strides;
  for (const Shape& s : shapes) strides.push_back(BroadcastStrides(s, out_shape));
  std::vector<double> out(static_cast<size_t>(n));
  std::vector<int64_t> index(out_shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    double v[3] = {0, 0, 0};
    for (size_t k = 0; k < in.size(); ++k) {
      int64_t off = 0;
      for (size_t d = 0; d < out_shape.size(); ++d) off += index[d] * strides[k][d];
      v[k] = LoadAsDouble(in[k], off);
    }
    if (ints) {
      auto iv = [&](int k) { return static_cast<int64_t>(v[k]); };
      out[i] = static_cast<double>(ReferenceScalarInt(kind, iv(0), iv(1), iv(2), a, i));
    } else {
      out[i] = ReferenceScalar(kind, v[0], v[1], v[2], a, i);
    }
    for (size_t d = out_shape.size(); d-- > 0;) {
      if (++index[d] < out_shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

}  // namespace graphfuse
