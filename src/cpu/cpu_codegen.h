// The CPU code generator's internals (graphfuse/cpu_codegen.h is the public side): what a
// program must look like to become one native loop, the loop's signature, and its source.
#pragma once

#include <memory>
#include <string>

#include "graphfuse/cpu_codegen.h"
#include "cpu/tile_program.h"

namespace graphfuse::cpu {

// How a native loop reads one input over a [rows, cols] iteration space (a 1-D space is one
// row): along the row (column stride 1; its row stride is an argument), one value per row
// (column stride 0), or one value everywhere.
enum class NativeRead : uint8_t { kRow, kPerRow, kScalar };

struct NativeProgram {
  InlineVec<NativeRead, kMaxTileInputs> inputs;
  InlineVec<DType, kMaxTileInputs> input_dtypes;  // f32, f16 or bf16 storage
  InlineVec<TileInstr, kMaxTileInstrs> instrs;    // f32; op and args (the attrs come per call)
  InlineVec<int, kMaxTileOutputs> outputs;        // registers, stored contiguously over the space
  InlineVec<DType, kMaxTileOutputs> output_dtypes;
};

// Elements [begin, end) of the space (any range; a row's last elements that do not fill a
// vector go through a padded one). in[k] points at input k's element (0, 0); out[o] at output
// o's first element; attrs[i] are instruction i's attributes. stream != 0: f32 outputs are
// stored non-temporally (only when begin and cols are multiples of the vector width, or the
// space is one row, and each such out[o] + begin is 64-byte aligned; the caller fences).
using NativeKernel = void (*)(const void* const* in, void* const* out, const OpAttrs* attrs,
                              const int64_t* row_strides, int64_t cols, int64_t begin, int64_t end, int stream);

// The C++ source of the program's loop, defining extern "C" `symbol`.
std::string NativeSource(const NativeProgram& p, const std::string& symbol);

// A compiled loop and the shared object that holds its code (kept alive by its users, so that a
// plan outliving its CpuCodegen never calls into unloaded code).
struct NativeCode {
  NativeKernel kernel = nullptr;
  std::shared_ptr<const void> keep;
};

// The compiled loop (from memory, the disk cache, or the compiler); an error when compiling
// failed (counted in the stats; callers fall back to the tile executor).
Result<NativeCode> GetNativeKernel(CpuCodegen& cg, const NativeProgram& p);
// Counts a program left to the tile executor, and why.
void CountOutsideScope(CpuCodegen& cg, const std::string& why);

}  // namespace graphfuse::cpu
