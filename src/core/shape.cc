#include "graphfuse/shape.h"

#include <algorithm>

namespace graphfuse {

std::string ShapeToString(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

Result<int64_t> NumElements(const Shape& s) {
  int64_t n = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] < 0) return InvalidArgument("shape ", ShapeToString(s), " has negative dim ", i);
    if (s[i] != 0 && n > INT64_MAX / s[i])
      return InvalidArgument("shape ", ShapeToString(s), " has more elements than int64 can count");
    n *= s[i];
  }
  return n;
}

Result<Shape> BroadcastShapes(std::span<const Shape> shapes) {
  size_t rank = 0;
  for (const Shape& s : shapes) {
    GF_RETURN_IF_ERROR(NumElements(s).status());
    rank = std::max(rank, s.size());
  }
  Shape out(rank, 1);
  for (size_t k = 0; k < rank; ++k) {  // k counts from the right
    int64_t d = 1;
    for (const Shape& s : shapes) {
      if (k >= s.size()) continue;
      int64_t v = s[s.size() - 1 - k];
      if (v == 1) continue;
      if (d != 1 && v != d) {
        std::string all;
        for (const Shape& t : shapes) all += (all.empty() ? "" : " and ") + ShapeToString(t);
        return InvalidArgument("shapes ", all, " do not broadcast: dim -", k + 1, " is ", d,
                               " in one and ", v, " in another");
      }
      d = v;
    }
    out[rank - 1 - k] = d;
  }
  return out;
}

std::vector<int64_t> BroadcastStrides(const Shape& in, const Shape& out) {
  std::vector<int64_t> strides(out.size(), 0);
  int64_t stride = 1;
  for (size_t k = 0; k < in.size(); ++k) {
    size_t di = in.size() - 1 - k, dout = out.size() - 1 - k;
    strides[dout] = (in[di] == 1 && out[dout] != 1) ? 0 : stride;
    stride *= in[di];
  }
  return strides;
}

std::vector<int64_t> ContiguousStrides(const Shape& s) {
  std::vector<int64_t> strides(s.size(), 1);
  for (size_t i = s.size(); i-- > 1;) strides[i - 1] = strides[i] * s[i];
  return strides;
}

}  // namespace graphfuse
