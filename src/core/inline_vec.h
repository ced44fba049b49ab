// A fixed-capacity vector stored inline: the per-launch structures of the executor are built on
// every call, and a heap allocation costs as much as a 1K-element add.
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>

#include "graphfuse/status.h"

namespace graphfuse {

// Elements are constructed on push_back only (raw storage), so an empty InlineVec of large
// structs costs nothing to create; T must be trivially destructible.
template <class T, size_t N>
class InlineVec {
  static_assert(std::is_trivially_destructible_v<T>);

 public:
  InlineVec() = default;
  InlineVec(std::initializer_list<T> init) {
    for (const T& v : init) push_back(v);
  }
  void push_back(const T& v) {
    GF_CHECK(size_ < N, "InlineVec capacity ", N, " exceeded");
    new (data() + size_++) T(v);
  }
  void resize(size_t n, const T& v = T()) {
    GF_CHECK(n <= N, "InlineVec capacity ", N, " exceeded");
    for (size_t i = size_; i < n; ++i) new (data() + i) T(v);
    size_ = n;
  }
  void clear() { size_ = 0; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  static constexpr size_t capacity() { return N; }
  T* data() { return std::launder(reinterpret_cast<T*>(storage_)); }
  const T* data() const { return std::launder(reinterpret_cast<const T*>(storage_)); }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }

  InlineVec(const InlineVec& o) { *this = o; }
  InlineVec& operator=(const InlineVec& o) {
    if (this == &o) return *this;
    for (size_t i = 0; i < o.size_; ++i) new (data() + i) T(o[i]);
    size_ = o.size_;
    return *this;
  }

 private:
  alignas(T) unsigned char storage_[N * sizeof(T)];
  size_t size_ = 0;
};

}  // namespace graphfuse
