// Lowers the body of a fused elementwise group (a graph of op-table nodes over one iteration
// space) into a tile program: one register per body input, one instruction per node, and a
// rounding instruction after every f16/bf16 intermediate so that the fused result equals what
// the unfused ops store. Data pointers are left null: the caller binds them per run.
#pragma once

#include "graphfuse/graph.h"
#include "cpu/tile_program.h"

namespace graphfuse::cpu {

// Errors (an op outside the table, mixed domains, capacities) name the body node at fault.
Result<TileProgram> LowerElementwiseGroup(const Graph& body);

}  // namespace graphfuse::cpu
