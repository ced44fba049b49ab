#include "onnx/tensor_proto.h"

#include <fcntl.h>
#include <onnx/onnx_pb.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
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

// A tensor of `dtype` and `shape` from its raw bytes (ONNX raw data: little-endian, as this
// machine is; `bytes` holds exactly its elements), bools normalized to 0 / 1.
Result<Tensor> FromRawBytes(DType dtype, const Shape& shape, const void* bytes) {
  GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(dtype, shape));
  if (t.numel() == 0) return t;
  std::memcpy(t.data(), bytes, t.nbytes());
  if (dtype == DType::kBool) {
    uint8_t* b = t.data_as<uint8_t>();
    for (int64_t i = 0; i < t.numel(); ++i) b[i] = b[i] != 0;
  }
  return t;
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

// A file mapped with one page of zeros after its last page, so that a vector tail reading past
// a tensor that ends with the file stays in mapped memory.
struct ExternalData::Mapping {
  char* base = nullptr;
  size_t size = 0;      // the file's
  size_t reserved = 0;  // the mapping's
  ~Mapping() {
    if (base) ::munmap(base, reserved);
  }
};

ExternalData::~ExternalData() = default;

int64_t ExternalData::mapped_bytes() const {
  int64_t n = 0;
  for (const auto& [path, m] : files_) n += static_cast<int64_t>(m->size);
  return n;
}

Result<std::shared_ptr<const ExternalData::Mapping>> ExternalData::Map(const std::string& path,
                                                                        const std::string& what) {
  if (auto it = files_.find(path); it != files_.end()) return it->second;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return InvalidArgument(what, ": its external data file '", path, "' cannot be opened (", std::strerror(errno), ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(what, ": its external data file '", path, "' is not a regular file");
  }
  auto m = std::make_shared<Mapping>();
  m->size = static_cast<size_t>(st.st_size);
  if (m->size > 0) {
    // Address space for the file and a page of zeros after it; then the file over its start.
    // Private and writable: the pages are the page cache's until written, and a write (no kernel
    // writes its weights) would copy its page instead of faulting.
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    m->reserved = (m->size + page - 1) / page * page + page;
    void* region = ::mmap(nullptr, m->reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void* p = region == MAP_FAILED ? MAP_FAILED
                                   : ::mmap(region, m->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      if (region != MAP_FAILED) ::munmap(region, m->reserved);
      ::close(fd);
      return InvalidArgument(what, ": its external data file '", path, "' cannot be mapped (", std::strerror(err), ")");
    }
    m->base = static_cast<char*>(p);
  }
  ::close(fd);
  files_[path] = m;
  return std::shared_ptr<const Mapping>(std::move(m));
}

Result<Tensor> ExternalData::Load(const onnx::TensorProto& p, DType dtype, const Shape& shape, int64_t n, size_t elem,
                                  const std::string& what) {
  std::string location;
  bool has_location = false;
  int64_t offset = 0, length = -1;
  for (const onnx::StringStringEntryProto& kv : p.external_data()) {
    if (kv.key() == "location") {
      location = kv.value(), has_location = true;
    } else if (kv.key() == "offset" || kv.key() == "length") {
      int64_t v = -1;
      const char* end = kv.value().data() + kv.value().size();
      const auto r = std::from_chars(kv.value().data(), end, v);
      if (r.ec != std::errc() || r.ptr != end || v < 0)
        return InvalidArgument(what, ": external data ", kv.key(), " '", kv.value(), "' is not a byte count");
      (kv.key() == "offset" ? offset : length) = v;
    }  // "checksum" and other keys: not needed to read the bytes
  }
  if (!has_location || location.empty()) return InvalidArgument(what, ": external data without a location");
  namespace fs = std::filesystem;
  const fs::path rel(location);
  if (rel.is_absolute() || rel.has_root_name() || rel.has_root_directory())
    return InvalidArgument(what, ": external data location '", location,
                           "' is absolute; ONNX locations are relative to the model's folder");
  const fs::path norm = rel.lexically_normal();
  if (norm.empty() || norm == "." || *norm.begin() == "..")
    return InvalidArgument(what, ": external data location '", location, "' leaves the model's folder");
  if (folder_.empty())
    return InvalidArgument(what, ": its data is in the external file '", location,
                           "', and the model came as bytes without its folder (load it from its file, or give "
                           "the folder with the bytes)");
  const std::string path = (fs::path(folder_) / norm).string();
  GF_ASSIGN_OR_RETURN(std::shared_ptr<const Mapping> map, Map(path, what));
  const uint64_t size = map->size;
  if (static_cast<uint64_t>(offset) > size)
    return InvalidArgument(what, ": external data offset ", offset, " lies past the end of '", path, "' (", size,
                           " bytes)");
  if (length < 0) length = static_cast<int64_t>(size) - offset;
  if (static_cast<uint64_t>(length) > size - static_cast<uint64_t>(offset))
    return InvalidArgument(what, ": external data bytes [", offset, ", ", offset + length, ") lie past the end of '",
                           path, "' (", size, " bytes)");
  if (n > kMaxTensorBytes / static_cast<int64_t>(elem))
    return ResourceExhausted(what, ": ", OnnxDTypeName(p.data_type()), ShapeToString(shape), " needs more than ",
                             kMaxTensorBytes >> 30, " GiB");
  if (length != n * static_cast<int64_t>(elem))
    return InvalidArgument(what, ": ", OnnxDTypeName(p.data_type()), ShapeToString(shape), " needs ", n, " x ", elem,
                           " bytes; external data '", path, "' gives ", length, " (offset ", offset, ")");
  char* at = map->base ? map->base + offset : nullptr;
  const bool in_place = n > 0 && dtype != DType::kBool && reinterpret_cast<uintptr_t>(at) % kTensorAlignment == 0 &&
                        static_cast<uint64_t>(offset + length) + kTensorAlignment <= map->reserved;
  if (in_place) return Tensor::Borrowed(dtype, shape, at, map);
  // Unaligned, or bool (normalized to 0 / 1): copied out of the mapping.
  return FromRawBytes(dtype, shape, at);
}

Result<Tensor> TensorFromProto(const onnx::TensorProto& p, const std::string& what, ExternalData* external) {
  const bool is_external = p.data_location() == onnx::TensorProto::EXTERNAL || p.external_data_size() > 0;
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
  if (is_external) {
    if (p.has_raw_data() || p.float_data_size() > 0 || p.int64_data_size() > 0 || p.int32_data_size() > 0)
      return InvalidArgument(what, ": holds its data both in the model and in an external file");
    if (!external)
      return Unimplemented(what, ": its data is in an external file, which is read only for a model's initializers");
    return external->Load(p, *dtype, shape, n, elem, what);
  }

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

  if (has_raw) return FromRawBytes(*dtype, shape, p.raw_data().data());
  GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(*dtype, shape));
  if (n == 0) return t;
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
