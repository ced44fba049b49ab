// ONNX TensorProto <-> graphfuse Tensor, and the ONNX element-type enum <-> DType.
//
// Only what graphfuse computes with is accepted (f32, f16, bf16, i32, i64, bool); any other
// element type, external or segmented data comes back as Unimplemented naming the tensor. Every
// size is checked against the bytes actually present before anything is allocated, so a
// malformed proto can neither crash the reader nor make it allocate more than it holds.
#pragma once

#include <cstdint>
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

// Converts a TensorProto (raw_data or the typed *_data fields). `what` names the tensor in
// errors, e.g. "initializer 'w'".
Result<Tensor> TensorFromProto(const onnx::TensorProto& proto, const std::string& what);
// Fills `proto` (dims, data_type, raw_data, name).
void TensorToProto(const Tensor& t, const std::string& name, onnx::TensorProto* proto);

// Reads the whole file into `bytes`; NotFound when it cannot be opened, InvalidArgument when it
// is larger than `max_bytes`.
Status ReadFileBytes(const std::string& path, int64_t max_bytes, std::string* bytes);

}  // namespace graphfuse::onnx_import
