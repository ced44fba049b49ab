#include "kernel_util.h"

namespace graphfuse::kernels {

std::vector<OpSchema> FusedRowwiseSchemas() { return {}; }

}  // namespace graphfuse::kernels
