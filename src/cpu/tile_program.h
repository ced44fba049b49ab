// The CPU tile executor. A tile program is a short straight-line list of op-table
// instructions over registers; the executor walks the iteration space in L1-sized tiles and,
// per tile, loads the inputs (converting dtype, reading broadcast operands with stride 0),
// runs the instructions with SIMD over the tile, and stores only the program's outputs.
// An unfused op is a one-instruction program; a fused group (a later pass) is a longer one,
// and its intermediates never leave the tile.
//
//   registers: [ inputs 0..I-1 | result of instr 0 | result of instr 1 | ... ]
//   program:   %2 = Add(%0, %1) ; %3 = Mul(%2, %0) ; store %3 -> out0
#pragma once

#include <array>
#include <memory>
#include <span>

#include "core/inline_vec.h"
#include "ir/elementwise_body.h"
#include "cpu/elementwise_kernels.h"
#include "graphfuse/cpu.h"

namespace graphfuse::cpu {

// Elements per tile: a tile's inputs, intermediates and outputs stay in L1 (48 KiB on the
// machine it was chosen on); 2048 spills to L2.
inline constexpr int64_t kTileElements = 1024;
// Capacities of one program (fixed, so that building one allocates nothing): any elementwise
// body the IR allows (ir/elementwise_body.h).
inline constexpr size_t kMaxTileRank = kMaxBodyRank, kMaxTileInputs = kMaxBodyInputs, kMaxTileInstrs = kMaxBodyInstrs,
                        kMaxTileOutputs = kMaxBodyOutputs;

using TileDims = InlineVec<int64_t, kMaxTileRank>;

struct TileInput {
  DType dtype;
  const void* data;
  TileDims strides;  // elements, one per dim of TileProgram::shape; 0 = broadcast
  Domain domain;                 // the register domain it is loaded into
};

struct TileInstr {
  OpKind op;
  std::array<int, 3> args{0, 0, 0};  // registers, all < this instruction's own register
  OpAttrs attrs;
  Domain domain;
};

struct TileOutput {
  int reg;
  DType dtype;
  void* data;  // contiguous over TileProgram::shape
};

struct TileProgram {
  TileDims shape;  // the iteration space (the output shape)
  InlineVec<TileInput, kMaxTileInputs> inputs;
  InlineVec<TileInstr, kMaxTileInstrs> instrs;
  InlineVec<TileOutput, kMaxTileOutputs> outputs;

  int num_registers() const { return static_cast<int>(inputs.size() + instrs.size()); }
  Domain RegisterDomain(int reg) const;
  // Compute cost per element (sum of the instructions' table costs, at least 1).
  int64_t CostPerElement() const;
};

// Strides for reading an input of shape `in` over the iteration space `out` (0 = broadcast).
TileDims TileStrides(const Shape& in, const Shape& out);
TileDims TileShape(const Shape& s);

// The one-instruction program of an unfused op (types must already be valid: RunOp checks).
TileProgram SingleOpProgram(OpKind kind, std::span<const TensorView> in, const TensorView& out, const OpAttrs& attrs);

// A program prepared once and run over parts of its iteration space by the caller's own
// threads: the prologue / epilogue of a fused GEMM, norm or softmax runs on the rows the
// kernel has just produced, while they are still in cache. Data pointers
// are bound at construction. Copies share the prepared state.
class TileRunner {
 public:
  // With `codegen`, a program within its scope runs as one compiled loop (cpu_codegen.h).
  explicit TileRunner(const TileProgram& program, CpuCodegen* codegen = nullptr);
  int64_t numel() const;
  size_t scratch_bytes() const;  // per calling thread
  // Elements [begin, end) of the iteration space (row-major), on the calling thread.
  void Run(int64_t begin, int64_t end, void* scratch) const;
  // The whole space as ONE launch, as RunTileProgram does, without planning it again.
  void Launch(const CpuContext& ctx) const;
  // Whether the runner was built from a program with these data pointers and this code
  // generator (the same shapes and instructions are the caller's to guarantee): a plan reuses
  // its runner while they hold.
  bool BoundTo(const TileProgram& p, const CpuCodegen* codegen) const;
  // Whether the program runs as a compiled loop.
  bool native() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// The unfused fast path of one f32 op over n contiguous elements (every input exactly the
// output's shape): the kernel runs straight over the caller's arrays on the calling thread,
// with nothing to plan. Returns false, having done nothing, where the tile executor is needed
// instead (work for more than one thread, a ragged tail, outputs stored non-temporally).
bool RunContiguousF32(OpKind kind, std::span<const float* const> in, float* out, int64_t n, const OpAttrs& attrs,
                      const CpuContext& ctx);

// Prefetches floats [p, p + n) into the cache, one request per cache line.
void PrefetchFloats(const float* p, int64_t n);

// Runs the program as ONE launch: at most one dispatch to the thread pool.
// Register domains and operands are internal invariants (checked, not reported).
void RunTileProgram(const TileProgram& program, const CpuContext& ctx);

}  // namespace graphfuse::cpu
