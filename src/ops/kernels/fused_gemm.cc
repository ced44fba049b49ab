#include "kernel_util.h"

namespace graphfuse::kernels {

std::vector<OpSchema> FusedGemmSchemas() { return {}; }

}  // namespace graphfuse::kernels
