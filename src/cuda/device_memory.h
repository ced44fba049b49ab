// The memory of a CUDA plan: device allocations, stream-ordered copies, and the buffer of every
// value the plan touches.
//
// Graph inputs, outputs and constants get buffers of their own (a constant is uploaded when
// first used); a view shares its input's buffer; values between nodes and per-node scratch take
// pooled blocks planned by liveness (src/memory/memory_plan.h) while the top-level graph is
// planned: every step runs in plan order on one stream (or in the CUDA graph captured from it),
// so a block whose last reader is top-level node i can be handed to any value first written
// after node i. Each block is allocated when the planner creates it. An emulated plan
// (CudaExecOptions::emulate) holds host memory instead, and its copies are plain memmoves.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "memory/memory_plan.h"
#include "graphfuse/graph.h"

namespace graphfuse::cuda {

// The bytes of a value's data.
inline size_t ValueBytes(const Value* v) { return static_cast<size_t>(v->numel()) * DTypeSize(v->dtype()); }

class DeviceMemory {
 public:
  // `emulate`: host memory (CudaExecOptions::emulate).
  explicit DeviceMemory(bool emulate) : emu_(emulate) {}
  ~DeviceMemory();  // frees every allocation
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  bool emulated() const { return emu_; }
  // The stream constants are uploaded on.
  void set_stream(cudaStream_t s) { stream_ = s; }

  // `bytes` held until destruction; `what` names them in the error.
  Result<void*> Alloc(size_t bytes, const std::string& what);
  // Stream-ordered copy (a plain memmove when emulating).
  Status Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) const;
  // Stream-ordered zero fill (a plain memset when emulating).
  Status Zero(void* dst, size_t bytes, cudaStream_t s, const std::string& where) const;
  // Waits for the stream (nothing to wait for when emulating).
  Status Sync(cudaStream_t s) const;

  // Pooling while the top-level graph `g` is planned: NextNode after each of its nodes.
  void BeginPooling(const Graph& g);
  void NextNode() { planner_->NextNode(); }
  void EndPooling();

  // The buffer of `v`, allocated on first use: pooled while pooling, unless `v` is a constant
  // (uploaded then) or a graph output.
  Result<void*> Buffer(const Value* v);
  // Whether `v` has a buffer yet; the buffer it has.
  bool Has(const Value* v) const { return buffers_.count(v) != 0; }
  void* At(const Value* v) const { return buffers_.at(v); }
  // `v`'s buffer is `p` (inside another value's: a reference graph's values are its node's).
  void Bind(const Value* v, void* p) { buffers_[v] = p; }
  // One buffer of `bytes` for `values` (a node's outputs, laid out in it by the caller, who binds
  // them): pooled until the last of them is read, unless one is a graph output or a constant.
  Result<void*> SharedBuffer(std::span<const Value* const> values, size_t bytes, const std::string& what);
  // Scratch for the node being planned (pooled: free again after it).
  Result<void*> Scratch(size_t bytes, const std::string& what);
  // `view`'s buffer is `of`'s: `of`'s block (if pooled) lives as long as either is read.
  void Alias(const Value* view, const Value* of);

  int64_t device_bytes() const { return device_bytes_; }  // every allocation added up
  // The pooled blocks' bytes; every pooled buffer added up, as if none were reused.
  int64_t activation_bytes() const { return activation_bytes_; }
  int64_t activation_bytes_no_reuse() const { return activation_bytes_no_reuse_; }

 private:
  // The memory of a pooled placement (allocated for a new block).
  Result<void*> BlockMemory(const MemoryPlacement& p, const std::string& what);

  bool emu_;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
  std::map<const Value*, void*> buffers_;
  std::optional<MemoryPlanner> planner_;  // while pooling
  std::vector<void*> blocks_;             // memory of each planned block
  std::set<const Value*> pinned_;         // graph outputs: never pooled
  int64_t device_bytes_ = 0, activation_bytes_ = 0, activation_bytes_no_reuse_ = 0;
};

}  // namespace graphfuse::cuda
