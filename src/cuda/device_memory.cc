#include "cuda/device_memory.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cuda/cuda_status.h"

namespace graphfuse::cuda {

DeviceMemory::~DeviceMemory() {
  for (void* p : allocations_) emu_ ? std::free(p) : static_cast<void>(cudaFree(p));
}

Result<void*> DeviceMemory::Alloc(size_t bytes, const std::string& what) {
  void* p = nullptr;
  if (emu_) {
    p = std::aligned_alloc(64, (std::max<size_t>(bytes, 16) + 63) / 64 * 64);
    if (!p) return ResourceExhausted("allocating ", bytes, " bytes for ", what);
  } else {
    GF_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 16)), StrCat("cudaMalloc of ", bytes, " bytes for ", what));
  }
  allocations_.push_back(p);
  device_bytes_ += static_cast<int64_t>(bytes);
  return p;
}

Status DeviceMemory::Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) const {
  if (bytes == 0) return Status::Ok();
  if (emu_) {
    std::memmove(dst, src, bytes);
    return Status::Ok();
  }
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, kind, s), "cudaMemcpyAsync");
}

Status DeviceMemory::Zero(void* dst, size_t bytes, cudaStream_t s, const std::string& where) const {
  if (emu_) return (std::memset(dst, 0, bytes), Status::Ok());
  return CudaStatus(cudaMemsetAsync(dst, 0, bytes, s), where);
}

Status DeviceMemory::Sync(cudaStream_t s) const {
  return emu_ ? Status::Ok() : CudaStatus(cudaStreamSynchronize(s), "synchronizing");
}

void DeviceMemory::BeginPooling(const Graph& g) {
  for (const Value* v : g.outputs()) pinned_.insert(v);
  planner_.emplace(g);
}

void DeviceMemory::EndPooling() {
  activation_bytes_ = planner_->plan().peak_bytes;
  activation_bytes_no_reuse_ = planner_->plan().no_reuse_bytes;
  planner_.reset();
}

Result<void*> DeviceMemory::BlockMemory(const MemoryPlacement& p, const std::string& what) {
  if (p.new_block) {
    GF_ASSIGN_OR_RETURN(void* block, Alloc(static_cast<size_t>(p.bytes), what));
    blocks_.push_back(block);
  }
  return blocks_[static_cast<size_t>(p.block)];
}

Result<void*> DeviceMemory::Buffer(const Value* v) {
  if (auto it = buffers_.find(v); it != buffers_.end()) return it->second;
  GF_ASSIGN_OR_RETURN(void* p,
                      SharedBuffer({&v, 1}, ValueBytes(v), StrCat("value '", v->name(), "' ", v->TypeString())));
  if (v->constant()) {
    GF_RETURN_IF_ERROR(Copy(p, v->constant()->data(), ValueBytes(v), cudaMemcpyHostToDevice, stream_)
                           .WithContext(StrCat("uploading constant '", v->name(), "'")));
  }
  buffers_[v] = p;
  return p;
}

Result<void*> DeviceMemory::SharedBuffer(std::span<const Value* const> values, size_t bytes, const std::string& what) {
  bool pool = planner_.has_value();
  for (const Value* v : values) pool = pool && !v->constant() && !pinned_.count(v);
  if (!pool) return Alloc(bytes, what);
  return BlockMemory(planner_->PlaceTogether(values, static_cast<int64_t>(bytes)), what);
}

Result<void*> DeviceMemory::Scratch(size_t bytes, const std::string& what) {
  if (!planner_) return Alloc(bytes, what);
  return BlockMemory(planner_->Scratch(static_cast<int64_t>(bytes)), what);
}

void DeviceMemory::Alias(const Value* view, const Value* of) {
  if (planner_) planner_->Alias(view, of);
}

}  // namespace graphfuse::cuda
