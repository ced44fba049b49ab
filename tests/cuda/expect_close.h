// The comparison the CUDA emulation tests make between a plan's outputs and the CPU's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "graphfuse/tensor.h"

namespace graphfuse::cuda {

// |got - want| <= atol + rtol * |want| everywhere (NaN only where want is NaN), the first three
// failures reported naming `what`; returns the worst |got - want|.
inline double ExpectClose(const Tensor& got, const Tensor& want, double rtol, double atol, const std::string& what) {
  double worst = 0;
  int reported = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double a = got.GetAsDouble(i), b = want.GetAsDouble(i);
    if (std::isnan(b) && std::isnan(a)) continue;
    const double err = std::fabs(a - b);
    worst = std::max(worst, std::isnan(err) ? INFINITY : err);
    if (!(err <= atol + rtol * std::fabs(b)) && reported++ < 3)
      ADD_FAILURE() << what << ": element " << i << " is " << a << ", the CPU gives " << b;
  }
  return worst;
}

}  // namespace graphfuse::cuda
