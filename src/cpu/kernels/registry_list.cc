// The non-elementwise ops: one schema list per kernel file, concatenated in a fixed order.
#include "kernel_util.h"

namespace graphfuse {

std::vector<OpSchema> NonElementwiseSchemas() {
  std::vector<OpSchema> all;
  for (auto list : {kernels::GemmSchemas(), kernels::NormSchemas(), kernels::SoftmaxSchemas(),
                    kernels::ReduceSchemas(), kernels::DataMovementSchemas(), kernels::ShapeOpSchemas(), kernels::RopeSchemas(),
                    kernels::AttentionSchemas(), kernels::FusedRowwiseSchemas(), kernels::FusedGemmSchemas()})
    all.insert(all.end(), list.begin(), list.end());
  return all;
}

}  // namespace graphfuse
