#include "kernel_util.h"

namespace graphfuse::kernels {

std::vector<OpSchema> RopeSchemas() { return {}; }

}  // namespace graphfuse::kernels
