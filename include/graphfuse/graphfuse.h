// graphfuse: elementwise operator library, automatic fusion, and execution on CPU and CUDA.
// The one header an embedding program includes.
#pragma once

#include "graphfuse/cpu.h"
#include "graphfuse/dtype.h"
#include "graphfuse/fusion.h"
#include "graphfuse/graph.h"
#include "graphfuse/model.h"
#include "graphfuse/ops.h"
#include "graphfuse/profiling.h"
#include "graphfuse/progress.h"
#include "graphfuse/shape.h"
#include "graphfuse/status.h"
#include "graphfuse/target.h"
#include "graphfuse/tensor.h"
