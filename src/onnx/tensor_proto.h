// ONNX TensorProto <-> graphfuse Tensor, and the ONNX element-type enum <-> DType.
//
// Only what graphfuse computes with is accepted (f32, f16, bf16, i32, i64, bool); any other
// element type, or segmented data, comes back as Unimplemented naming the tensor. Every size is
// checked against the bytes actually present before anything is allocated, so a malformed proto
// can neither crash the reader nor make it allocate more than it holds. Data kept in external
// files (ONNX's external_data: location, offset, length) is read through ExternalData.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "graphfuse/dtype.h"
#include "graphfuse/status.h"
#include "graphfuse/tensor.h"

namespace onnx {
class TensorProto;
}

namespace graphfuse::onnx_import {

// Files larger than protobuf can parse (2 GiB) are refused before reading them.
inline constexpr int64_t kMaxProtoFileBytes = (int64_t{1} << 31) - 1;

// A dim beyond this is refused even when the tensor has no elements ([0, 2^62] is "valid"):
// no real model has one, and refusing it keeps every later shape computation far from int64
// overflow.
inline constexpr int64_t kMaxImportDim = int64_t{1} << 40;
// Likewise for the rank.
inline constexpr int kMaxImportRank = 64;

// "FLOAT", "INT64", ... for an ONNX TensorProto.DataType value; "<n>" for unknown values.
std::string OnnxDTypeName(int32_t onnx_dtype);
// The DType of an ONNX element type; Unimplemented (naming the ONNX type) for the others.
Result<DType> DTypeFromOnnx(int32_t onnx_dtype);
// The ONNX element type of a DType.
int32_t OnnxFromDType(DType dtype);

// The external data files of one model: ONNX's external_data entries name a file by a path
// relative to the model's folder ("location"), where its bytes start ("offset", default 0) and
// how many there are ("length", default: to the file's end). Each file is mapped once, read
// only and private, and a tensor whose bytes lie aligned in it is a view of the mapping (no
// copy; the pages are the page cache's); another is copied out of it. A location that is
// absolute or leaves the folder ("..") is refused, as is a missing file, a range past the file's
// end, or a length that is not the tensor's size, each naming the tensor and the path.
// Symbolic links inside the folder are followed (a hub cache's snapshot links its blobs).
class ExternalData {
 public:
  // `folder`: the model's folder; empty when the model came as bytes without one, which refuses
  // every external tensor.
  explicit ExternalData(std::string folder) : folder_(std::move(folder)) {}
  ~ExternalData();
  // The tensor of `dtype` and `shape` (n elements of `elem` bytes) kept where `proto`'s
  // external_data says.
  Result<Tensor> Load(const onnx::TensorProto& proto, DType dtype, const Shape& shape, int64_t n, size_t elem,
                      const std::string& what);
  // Bytes mapped so far, over every file.
  int64_t mapped_bytes() const;

 private:
  struct Mapping;
  Result<std::shared_ptr<const Mapping>> Map(const std::string& path, const std::string& what);
  std::string folder_;
  std::map<std::string, std::shared_ptr<const Mapping>> files_;
};

// Converts a TensorProto (raw_data or the typed *_data fields, or external data through
// `external`, when given). `what` names the tensor in errors, e.g. "initializer 'w'".
Result<Tensor> TensorFromProto(const onnx::TensorProto& proto, const std::string& what,
                               ExternalData* external = nullptr);
// Fills `proto` (dims, data_type, raw_data, name).
void TensorToProto(const Tensor& t, const std::string& name, onnx::TensorProto* proto);

// Reads the whole file into `bytes`; NotFound when it cannot be opened, InvalidArgument when it
// is larger than `max_bytes`.
Status ReadFileBytes(const std::string& path, int64_t max_bytes, std::string* bytes);

}  // namespace graphfuse::onnx_import
