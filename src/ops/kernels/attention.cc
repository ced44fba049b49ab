#include "kernel_util.h"

namespace graphfuse::kernels {

std::vector<OpSchema> AttentionSchemas() { return {}; }

}  // namespace graphfuse::kernels
