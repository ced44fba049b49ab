// Automatic elementwise fusion: groups op-table nodes that iterate over the same space into
// FusedElementwise nodes, each run as ONE kernel whose intermediates stay in the tile.
//
//   %0 = Add(%x, %y)                      %u = FusedElementwise(%x, %y, %s, %b) {body = graph {
//   %1 = Mul(%0, %s)            ==>             %0 = Add(%x, %y); %1 = Mul(%0, %s); %u = Add(%1, %b)
//   %u = Add(%1, %b)                          }}
//
// Note on the algorithm. Groups grow by union along producer -> consumer edges in
// topological order (vertical: chains, diamonds, multi-consumer values, broadcast operands
// read as group inputs), then siblings that read the same tensor are merged (horizontal).
// Every merge passes legality (fusion_legality.h: same iteration space, same compute domain,
// caps), a cycle check, and the cost policy. The cycle check refuses a merge of A and B when
// a path leaves A, goes through anything outside both -- a node, or another group -- and enters
// B (or back):
//
//        A:  a ----------> b  :B         fusing a and b would put c both after and
//             \           ^              before the fused node: refused
//              --> c -----/              (would-create-cycle)
//
// A group is one node-to-be, so the path may enter a third group C at one member and leave it
// from another with no edge between the two: A -> c1, c2 -> B with c1, c2 in C is a path. The
// check runs on the graph of groups before each merge (which keeps that graph acyclic), so the
// rewrite never meets a cycle.
//
// A value computed in a group is written to memory only when a node outside the group or
// the graph's outputs read it (then the group has several outputs). A cheap producer
// (table cost <= recompute_max_cost) whose value is read by other groups is recomputed in
// those groups instead, when that moves fewer bytes than storing and reloading the value.
#pragma once

#include <string>
#include <vector>

#include "passes/fusion_legality.h"
#include "graphfuse/graph.h"

namespace graphfuse {


Result<FusionReport> FuseElementwise(Graph& g, const FusionOptions& options = {});

// Eight hex digits hashing a fused kernel's body (its printed IR): the stable suffix of
// kernel names, so that two kernels with the same name compute the same thing.
std::string KernelHash(const Graph& body);

// Kernels a graph launches per run (nodes that are not views).
int64_t CountKernels(const Graph& g);

}  // namespace graphfuse
