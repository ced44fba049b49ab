// The target that evaluates nodes on the host for the layers above the backends (the importer
// folds constants with it as it builds): the CPU's, named here so that they include no backend.
#pragma once

#include "graphfuse/target.h"

namespace graphfuse {

const Target& HostTarget();

}  // namespace graphfuse
