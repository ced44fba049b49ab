#include "graphfuse/tensor.h"

#include <cmath>
#include <cstdlib>
#include <limits>

namespace graphfuse {

void Tensor::Free::operator()(void* p) const { std::free(p); }

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<Tensor> Tensor::Empty(DType dtype, const Shape& shape) {
  auto n = NumElements(shape);
  if (!n.ok()) return n.status().WithContext(StrCat("tensor ", DTypeName(dtype), ShapeToString(shape)));
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype));
  if (*n > kMaxTensorBytes / elem)
    return ResourceExhausted("tensor ", DTypeName(dtype), ShapeToString(shape), " needs more than ",
                             kMaxTensorBytes >> 30, " GiB; refusing the allocation");
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.numel_ = *n;
  // Round up to whole cache lines (and allocate at least one) so vector tails may over-read.
  size_t bytes = (static_cast<size_t>(*n * elem) + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  if (bytes == 0) bytes = kTensorAlignment;
  void* p = std::aligned_alloc(kTensorAlignment, bytes);
  if (!p)
    return ResourceExhausted("cannot allocate ", bytes, " bytes for tensor ", DTypeName(dtype),
                             ShapeToString(shape));
  t.data_.reset(p);
  return t;
}

Result<Tensor> Tensor::FromFloats(DType dtype, const Shape& shape, const std::vector<float>& values) {
  GF_ASSIGN_OR_RETURN(Tensor t, Empty(dtype, shape));
  if (static_cast<int64_t>(values.size()) != t.numel())
    return InvalidArgument("tensor ", DTypeName(dtype), ShapeToString(shape), " needs ", t.numel(),
                           " values, got ", values.size());
  for (int64_t i = 0; i < t.numel(); ++i) t.SetFromDouble(i, values[i]);
  return t;
}

double Tensor::GetAsDouble(int64_t i) const { return LoadAsDouble(view(), i); }
void Tensor::SetFromDouble(int64_t i, double v) { StoreFromDouble(view(), i, v); }

double LoadAsDouble(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: return t.as<float>()[i];
    case DType::kF16: return F16BitsToF32(t.as<uint16_t>()[i]);
    case DType::kBF16: return BF16BitsToF32(t.as<uint16_t>()[i]);
    case DType::kI32: return t.as<int32_t>()[i];
    case DType::kI64: return static_cast<double>(t.as<int64_t>()[i]);
    case DType::kBool: return t.as<uint8_t>()[i] ? 1.0 : 0.0;
  }
  return 0;
}

// Float -> integer casts truncate toward zero, saturate at the type's range and send NaN to 0
// (C++ leaves those cases undefined; ONNX leaves them unspecified).
template <class I>
static I SaturatingCast(double v) {
  if (std::isnan(v)) return 0;
  if (v <= static_cast<double>(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (v >= static_cast<double>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return static_cast<I>(v);
}

void StoreFromDouble(const TensorView& t, int64_t i, double v) {
  switch (t.dtype) {
    case DType::kF32: t.as<float>()[i] = static_cast<float>(v); break;
    case DType::kF16: t.as<uint16_t>()[i] = F32ToF16Bits(static_cast<float>(v)); break;
    case DType::kBF16: t.as<uint16_t>()[i] = F32ToBF16Bits(static_cast<float>(v)); break;
    case DType::kI32: t.as<int32_t>()[i] = SaturatingCast<int32_t>(v); break;
    case DType::kI64: t.as<int64_t>()[i] = SaturatingCast<int64_t>(v); break;
    case DType::kBool: t.as<uint8_t>()[i] = (v != 0.0) ? 1 : 0; break;  // NaN is true, as in C
  }
}

}  // namespace graphfuse
