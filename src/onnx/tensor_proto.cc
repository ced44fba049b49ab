#include "onnx/tensor_proto.h"

#include <onnx/onnx_pb.h>

#include <cstdio>
#include <cstring>
#include <memory>

namespace graphfuse::onnx_import {
namespace {

size_t OnnxElementBytes(int32_t t) {
  switch (t) {
    case onnx::TensorProto::FLOAT: return 4;
    case onnx::TensorProto::FLOAT16: return 2;
    case onnx::TensorProto::BFLOAT16: return 2;
    case onnx::TensorProto::INT32: return 4;
    case onnx::TensorProto::INT64: return 8;
    case onnx::TensorProto::BOOL: return 1;
    default: return 0;
  }
}

// Copies `n` values of a repeated field into the tensor, converting each with `conv`.
template <class Field, class Conv>
void CopyTyped(const Field& field, Tensor& t, Conv conv) {
  for (int64_t i = 0; i < t.numel(); ++i) conv(i, field.Get(static_cast<int>(i)));
}

}  // namespace

std::string OnnxDTypeName(int32_t t) {
  if (t >= 0 && t <= onnx::TensorProto::DataType_MAX && onnx::TensorProto::DataType_IsValid(t))
    return onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(t));
  return StrCat("<", t, ">");
}

Result<DType> DTypeFromOnnx(int32_t t) {
  switch (t) {
    case onnx::TensorProto::FLOAT: return DType::kF32;
    case onnx::TensorProto::FLOAT16: return DType::kF16;
    case onnx::TensorProto::BFLOAT16: return DType::kBF16;
    case onnx::TensorProto::INT32: return DType::kI32;
    case onnx::TensorProto::INT64: return DType::kI64;
    case onnx::TensorProto::BOOL: return DType::kBool;
    default:
      return Unimplemented("element type ", OnnxDTypeName(t),
                           " is not supported (graphfuse computes with FLOAT, FLOAT16, BFLOAT16, INT32, INT64, BOOL)");
  }
}

int32_t OnnxFromDType(DType d) {
  switch (d) {
    case DType::kF32: return onnx::TensorProto::FLOAT;
    case DType::kF16: return onnx::TensorProto::FLOAT16;
    case DType::kBF16: return onnx::TensorProto::BFLOAT16;
    case DType::kI32: return onnx::TensorProto::INT32;
    case DType::kI64: return onnx::TensorProto::INT64;
    case DType::kBool: return onnx::TensorProto::BOOL;
  }
  return onnx::TensorProto::UNDEFINED;
}

Result<Tensor> TensorFromProto(const onnx::TensorProto& p, const std::string& what) {
  if (p.data_location() == onnx::TensorProto::EXTERNAL || p.external_data_size() > 0)
    return Unimplemented(what, ": external data is not supported (embed the tensor in the model)");
  if (p.has_segment()) return Unimplemented(what, ": segmented tensors are not supported");
  auto dtype = DTypeFromOnnx(p.data_type());
  if (!dtype.ok()) return dtype.status().WithContext(what);
  if (p.dims_size() > kMaxImportRank)
    return Unimplemented(what, ": rank ", p.dims_size(), " exceeds the supported ", kMaxImportRank);
  Shape shape(p.dims().begin(), p.dims().end());
  for (size_t k = 0; k < shape.size(); ++k)
    if (shape[k] > kMaxImportDim)
      return InvalidArgument(what, ": dim ", k, " is ", shape[k], ", more than graphfuse accepts (2^40)");
  auto numel = NumElements(shape);
  if (!numel.ok()) return numel.status().WithContext(what);
  const int64_t n = *numel;
  const size_t elem = OnnxElementBytes(p.data_type());

  // How many values the proto holds, in the field ONNX prescribes for this type.
  const bool has_raw = p.has_raw_data();
  int64_t typed = 0;
  const char* field = "";
  switch (p.data_type()) {
    case onnx::TensorProto::FLOAT: typed = p.float_data_size(); field = "float_data"; break;
    case onnx::TensorProto::INT64: typed = p.int64_data_size(); field = "int64_data"; break;
    default: typed = p.int32_data_size(); field = "int32_data"; break;
  }
  if (has_raw && typed > 0)
    return InvalidArgument(what, ": holds both raw_data and ", field, " (ONNX allows one)");
  if (has_raw) {
    // n <= 2^31 here unless the byte count mismatches, so the multiplication cannot overflow.
    if (static_cast<uint64_t>(n) > p.raw_data().size() || p.raw_data().size() != static_cast<size_t>(n) * elem)
      return InvalidArgument(what, ": ", OnnxDTypeName(p.data_type()), ShapeToString(shape), " needs ",
                             n, " x ", elem, " bytes of raw_data, the tensor has ", p.raw_data().size());
  } else if (typed != n) {
    return InvalidArgument(what, ": ", OnnxDTypeName(p.data_type()), ShapeToString(shape), " needs ", n,
                           " values, ", field, " has ", typed);
  }

  GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(*dtype, shape));
  if (n == 0) return t;
  if (has_raw) {
    std::memcpy(t.data(), p.raw_data().data(), p.raw_data().size());  // ONNX raw data is little-endian
    if (*dtype == DType::kBool) {
      uint8_t* b = t.data_as<uint8_t>();
      for (int64_t i = 0; i < n; ++i) b[i] = b[i] != 0;
    }
    return t;
  }
  switch (*dtype) {
    case DType::kF32:
      std::memcpy(t.data(), p.float_data().data(), static_cast<size_t>(n) * 4);
      break;
    case DType::kI64:
      std::memcpy(t.data(), p.int64_data().data(), static_cast<size_t>(n) * 8);
      break;
    case DType::kI32:
      std::memcpy(t.data(), p.int32_data().data(), static_cast<size_t>(n) * 4);
      break;
    case DType::kF16:
    case DType::kBF16: {  // the 16 bits of each value sit in the low half of an int32
      uint16_t* d = t.data_as<uint16_t>();
      CopyTyped(p.int32_data(), t, [d](int64_t i, int32_t v) { d[i] = static_cast<uint16_t>(v & 0xffff); });
      break;
    }
    case DType::kBool: {
      uint8_t* d = t.data_as<uint8_t>();
      CopyTyped(p.int32_data(), t, [d](int64_t i, int32_t v) { d[i] = v != 0; });
      break;
    }
  }
  return t;
}

void TensorToProto(const Tensor& t, const std::string& name, onnx::TensorProto* p) {
  p->Clear();
  if (!name.empty()) p->set_name(name);
  for (int64_t d : t.shape()) p->add_dims(d);
  p->set_data_type(OnnxFromDType(t.dtype()));
  p->set_raw_data(static_cast<const char*>(t.data()), t.nbytes());
}

Status ReadFileBytes(const std::string& path, int64_t max_bytes, std::string* bytes) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return NotFound(path, ": cannot open (", std::strerror(errno), ")");
  if (fseeko(f.get(), 0, SEEK_END) != 0) return InvalidArgument(path, ": cannot seek (not a regular file?)");
  const off_t size = ftello(f.get());
  if (size < 0) return InvalidArgument(path, ": cannot tell its size");
  if (size > max_bytes)
    return InvalidArgument(path, ": file is ", size, " bytes; ONNX protobuf files are limited to 2 GiB "
                           "(larger models need external data, which graphfuse does not read)");
  if (fseeko(f.get(), 0, SEEK_SET) != 0) return InvalidArgument(path, ": cannot seek");
  bytes->resize(static_cast<size_t>(size));
  if (size > 0 && std::fread(bytes->data(), 1, bytes->size(), f.get()) != bytes->size())
    return InvalidArgument(path, ": read error");
  return Status::Ok();
}

}  // namespace graphfuse::onnx_import
