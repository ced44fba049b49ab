#include "graphfuse/tensor.h"

#include <cmath>
#include <cstring>
#include <cstdlib>
#include <limits>

namespace graphfuse {

void Tensor::Free::operator()(void* p) const {
  if (!owner) std::free(p);
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {
// The elements of a tensor of `dtype` and `shape`: refused when the shape is malformed or the
// tensor would hold more than kMaxTensorBytes.
Result<int64_t> CheckedNumel(DType dtype, const Shape& shape) {
  auto n = NumElements(shape);
  if (!n.ok()) return n.status().WithContext(StrCat("tensor ", DTypeName(dtype), ShapeToString(shape)));
  if (*n > kMaxTensorBytes / static_cast<int64_t>(DTypeSize(dtype)))
    return ResourceExhausted("tensor ", DTypeName(dtype), ShapeToString(shape), " needs more than ",
                             kMaxTensorBytes >> 30, " GiB; refusing the allocation");
  return *n;
}
}  // namespace

Result<Tensor> Tensor::Empty(DType dtype, const Shape& shape) {
  GF_ASSIGN_OR_RETURN(const int64_t n, CheckedNumel(dtype, shape));
  const int64_t elem = static_cast<int64_t>(DTypeSize(dtype));
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.numel_ = n;
  // Round up to whole cache lines (and allocate at least one) so vector tails may over-read.
  size_t bytes = (static_cast<size_t>(n * elem) + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  if (bytes == 0) bytes = kTensorAlignment;
  void* p = std::aligned_alloc(kTensorAlignment, bytes);
  if (!p)
    return ResourceExhausted("cannot allocate ", bytes, " bytes for tensor ", DTypeName(dtype),
                             ShapeToString(shape));
  t.data_.reset(p);
  return t;
}

Result<Tensor> Tensor::Borrowed(DType dtype, const Shape& shape, void* data, std::shared_ptr<const void> owner) {
  GF_ASSIGN_OR_RETURN(const int64_t n, CheckedNumel(dtype, shape));
  if (!owner || !data || reinterpret_cast<uintptr_t>(data) % kTensorAlignment != 0)
    return InvalidArgument("tensor ", DTypeName(dtype), ShapeToString(shape),
                           ": borrowed memory needs an owner and a ", kTensorAlignment, "-byte aligned address");
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.numel_ = n;
  t.data_ = std::unique_ptr<void, Free>(data, Free{std::move(owner)});
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

bool TensorView::contiguous() const {
  if (strides.empty()) return true;
  if (strides.size() != shape.size()) return false;
  for (int64_t d : shape)
    if (d == 0) return true;  // no elements: any strides describe them
  int64_t expect = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    if (shape[k] != 1 && strides[k] != expect) return false;
    expect *= shape[k];
  }
  return true;
}

Status CopyView(const TensorView& src, const TensorView& dst) {
  if (src.dtype != dst.dtype || src.shape != dst.shape)
    return InvalidArgument("cannot copy ", DTypeName(src.dtype), ShapeToString(src.shape), " into ",
                           DTypeName(dst.dtype), ShapeToString(dst.shape));
  for (const TensorView* v : {&src, &dst})
    if (!v->strides.empty() && v->strides.size() != v->shape.size())
      return InvalidArgument("a view of ", ShapeToString(v->shape), " has ", v->strides.size(), " strides");
  const int64_t n = src.numel();
  if (n == 0) return Status::Ok();
  const size_t esize = DTypeSize(src.dtype);
  const size_t rank = src.shape.size();
  if (src.contiguous() && dst.contiguous()) {
    std::memmove(dst.data, src.data, static_cast<size_t>(n) * esize);
    return Status::Ok();
  }
  const std::vector<int64_t> cs = ContiguousStrides(src.shape);
  const std::vector<int64_t>& ss = src.strides.empty() ? cs : src.strides;
  const std::vector<int64_t>& ds = dst.strides.empty() ? cs : dst.strides;
  // Row by row over the last dim; the index of the other dims walks like an odometer.
  const int64_t cols = rank ? src.shape.back() : 1;
  const int64_t s_last = rank ? ss.back() : 1, d_last = rank ? ds.back() : 1;
  std::vector<int64_t> idx(rank, 0);
  const char* s = static_cast<const char*>(src.data);
  char* d = static_cast<char*>(dst.data);
  for (int64_t row = 0; row < n / cols; ++row) {
    int64_t so = 0, dof = 0;
    for (size_t k = 0; k + 1 < rank; ++k) so += idx[k] * ss[k], dof += idx[k] * ds[k];
    if (s_last == 1 && d_last == 1) {
      std::memmove(d + dof * esize, s + so * esize, static_cast<size_t>(cols) * esize);
    } else {
      for (int64_t c = 0; c < cols; ++c) std::memcpy(d + (dof + c * d_last) * esize, s + (so + c * s_last) * esize, esize);
    }
    for (size_t k = rank >= 1 ? rank - 1 : 0; k-- > 0;) {
      if (++idx[k] < src.shape[k]) break;
      idx[k] = 0;
    }
  }
  return Status::Ok();
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
