// Tensors: an aligned owning buffer (Tensor) and a non-owning view (TensorView).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "graphfuse/dtype.h"
#include "graphfuse/shape.h"
#include "graphfuse/status.h"

namespace graphfuse {

// Buffers are aligned to a cache line, which is also the widest vector (AVX-512).
inline constexpr size_t kTensorAlignment = 64;
// A single tensor larger than this is refused as absurd rather than attempted.
inline constexpr int64_t kMaxTensorBytes = int64_t{1} << 38;  // 256 GiB

// Non-owning: dtype, shape and a pointer to the data, row-major contiguous unless `strides`
// says otherwise.
struct TensorView {
  TensorView() = default;
  TensorView(DType dtype, Shape shape, void* data, std::vector<int64_t> strides = {})
      : dtype(dtype), shape(std::move(shape)), data(data), strides(std::move(strides)) {}

  DType dtype = DType::kF32;
  Shape shape;
  void* data = nullptr;
  // Element strides, one per dim (a NumPy view's, say); empty: row-major contiguous. Kernels
  // take contiguous views. CompiledModel::Run takes any strides: it hands a strided view on
  // where the executable reads or writes it in place (Executable::TakesStrided: a KV cache kept
  // in a buffer of larger capacity) and copies the others.
  std::vector<int64_t> strides;

  int64_t numel() const;  // product of dims (the shape is assumed valid)
  // Whether the elements lie row-major contiguous: no strides, or the contiguous ones (a dim of
  // size 1 may have any stride; a view with no elements is contiguous).
  bool contiguous() const;
  template <class T>
  T* as() const { return static_cast<T*>(data); }
};

class Tensor {
 public:
  Tensor() = default;
  // Allocates an uninitialized tensor; errors name the dtype and shape when it is
  // malformed (negative dim), absurd (> kMaxTensorBytes) or the allocation fails.
  static Result<Tensor> Empty(DType dtype, const Shape& shape);
  // Copies `values` converted to `dtype` (round-to-nearest-even for f16/bf16).
  static Result<Tensor> FromFloats(DType dtype, const Shape& shape, const std::vector<float>& values);
  // A tensor over memory that `owner` keeps alive (a mapped file): nothing is copied or freed.
  // `data` must be kTensorAlignment-aligned, and the kTensorAlignment bytes past the tensor's
  // end readable (vector tails over-read, as they may on an Empty tensor).
  static Result<Tensor> Borrowed(DType dtype, const Shape& shape, void* data, std::shared_ptr<const void> owner);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * DTypeSize(dtype_); }
  void* data() { return data_.get(); }
  const void* data() const { return data_.get(); }
  template <class T>
  T* data_as() { return static_cast<T*>(data_.get()); }
  template <class T>
  const T* data_as() const { return static_cast<const T*>(data_.get()); }
  TensorView view() const { return TensorView{dtype_, shape_, data_.get()}; }

  // Element i read as double, whatever the dtype.
  double GetAsDouble(int64_t i) const;
  // Element i set from a double (converted and rounded to the dtype).
  void SetFromDouble(int64_t i, double v);

 private:
  struct Free {
    std::shared_ptr<const void> owner;  // set: the memory is the owner's (Borrowed), not freed here
    void operator()(void* p) const;
  };
  DType dtype_ = DType::kF32;
  Shape shape_;
  int64_t numel_ = 0;
  std::unique_ptr<void, Free> data_;
};

// Copies `src` into `dst` element by element, each read and written through its strides;
// dtype and shape must agree.
Status CopyView(const TensorView& src, const TensorView& dst);

// Reads element i of a view as double / writes it from double, for any dtype.
double LoadAsDouble(const TensorView& t, int64_t i);
void StoreFromDouble(const TensorView& t, int64_t i, double v);

}  // namespace graphfuse
