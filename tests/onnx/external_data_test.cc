// Initializers kept in external data files (ONNX external_data: location, offset, length), as
// the dynamo exporter writes model.onnx.data and as every model over 2 GB must: loaded from the
// model's folder, mapped where they lie aligned, refused with the initializer and the path named
// where the reference is bad.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "graphfuse/model.h"
#include "model_builder.h"

namespace graphfuse {
namespace {

namespace fs = std::filesystem;

// A fresh folder under the test's temporary directory.
fs::path TempFolder(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / StrCat("graphfuse_external_", name, "_", ::getpid());
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Points `t` at `length` bytes of `location` from `offset` (its own data cleared).
void MakeExternal(onnx::TensorProto* t, const std::string& location, int64_t offset, int64_t length) {
  t->clear_float_data();
  t->clear_raw_data();
  t->set_data_location(onnx::TensorProto::EXTERNAL);
  auto add = [&](const char* key, const std::string& value) {
    auto* e = t->add_external_data();
    e->set_key(key);
    e->set_value(value);
  };
  add("location", location);
  if (offset >= 0) add("offset", std::to_string(offset));
  if (length >= 0) add("length", std::to_string(length));
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// y = x @ W + b: W [3, 4] and b [4], embedded or kept in weights/w.data (W at offset 128,
// aligned; b at 128 + 48 + 4, not aligned: copied out).
struct Linear {
  std::vector<float> w, b;
  ModelBuilder builder;
  Linear() {
    for (int i = 0; i < 12; ++i) w.push_back(0.25f * static_cast<float>(i) - 1.f);
    for (int i = 0; i < 4; ++i) b.push_back(0.5f * static_cast<float>(i) + 0.125f);
    builder.Input("x", {2, 3});
    builder.FloatInit("W", {3, 4}, w);
    builder.FloatInit("b", {4}, b);
    builder.Node("MatMul", {"x", "W"}, {"xw"}, "mm");
    builder.Node("Add", {"xw", "b"}, {"y"}, "add");
    builder.Output("y");
  }
  onnx::TensorProto* init(int i) { return builder.g().mutable_initializer(i); }
  // The data file and the model pointing into it.
  std::string Externalize(const fs::path& folder, const std::string& location = "weights/w.data") {
    std::string data(128, '\x7f');
    data += Bytes(w);
    data += std::string(4, '\x7f');
    data += Bytes(b);
    WriteFile(folder / "weights" / "w.data", data);
    MakeExternal(init(0), location, 128, 48);
    MakeExternal(init(1), location, 128 + 48 + 4, -1);  // no length: to the file's end
    return builder.m.SerializeAsString();
  }
};

Result<std::vector<Tensor>> RunOn(Result<Model> model, const Tensor& x) {
  if (!model.ok()) return model.status();
  GF_ASSIGN_OR_RETURN(auto compiled, CompiledModel::Compile(std::move(*model), MakeTarget("cpu").value()));
  const TensorView in[] = {x.view()};
  return compiled->Run(in);
}

TEST(ExternalData, WeightsInAnExternalFileRunAsEmbeddedOnes) {
  const fs::path folder = TempFolder("linear");
  Linear embedded, external;
  const std::string embedded_bytes = embedded.builder.m.SerializeAsString();
  WriteFile(folder / "model.onnx", external.Externalize(folder));
  Tensor x = Tensor::FromFloats(DType::kF32, {2, 3}, {1.f, -2.f, 0.5f, 3.f, 0.25f, -1.f}).value();

  auto want = RunOn(Model::FromOnnxBytes(embedded_bytes), x);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  auto from_file = RunOn(Model::FromOnnxFile((folder / "model.onnx").string()), x);
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  auto from_bytes = RunOn(Model::FromOnnxBytes(external.builder.m.SerializeAsString(), "m", folder.string()), x);
  ASSERT_TRUE(from_bytes.ok()) << from_bytes.status().ToString();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      double ref = external.b[static_cast<size_t>(j)];
      for (int k = 0; k < 3; ++k)
        ref += static_cast<double>(x.data_as<float>()[i * 3 + k]) * external.w[static_cast<size_t>(k * 4 + j)];
      const int64_t at = i * 4 + j;
      EXPECT_NEAR((*want)[0].GetAsDouble(at), ref, 1e-5);
      EXPECT_EQ((*from_file)[0].GetAsDouble(at), (*want)[0].GetAsDouble(at)) << at;
      EXPECT_EQ((*from_bytes)[0].GetAsDouble(at), (*want)[0].GetAsDouble(at)) << at;
    }
  fs::remove_all(folder);
}

// Every bad reference is refused at load, naming the initializer and the location or path.
TEST(ExternalData, BadReferencesAreRefusedNamingTheInitializerAndThePath) {
  const fs::path folder = TempFolder("bad");
  struct Case {
    const char* what;
    std::string location;
    int64_t offset, length;
    const char* says;
  };
  WriteFile(folder / "outside.data", std::string(256, '\0'));
  const fs::path inner = folder / "model";
  const std::vector<Case> cases = {
      {"absolute", (folder / "outside.data").string(), 0, 48, "is absolute"},
      {"leaves the folder", "../outside.data", 0, 48, "leaves the model's folder"},
      {"leaves through a subfolder", "weights/../../outside.data", 0, 48, "leaves the model's folder"},
      {"missing", "weights/none.data", 0, 48, "cannot be opened"},
      {"past the end", "weights/w.data", 200, 48, "past the end"},
      {"offset past the end", "weights/w.data", 4096, -1, "past the end"},
      {"wrong length", "weights/w.data", 128, 44, "needs 12 x 4 bytes"},
      {"not a count", "weights/w.data", 0, -1, "'12abc' is not a byte count"},
  };
  for (const Case& c : cases) {
    Linear model;
    model.Externalize(inner);
    MakeExternal(model.init(0), c.location, c.offset, c.length);
    if (std::string(c.what) == "not a count") model.init(0)->mutable_external_data(1)->set_value("12abc");  // the offset
    WriteFile(inner / "model.onnx", model.builder.m.SerializeAsString());
    auto m = Model::FromOnnxFile((inner / "model.onnx").string());
    ASSERT_FALSE(m.ok()) << c.what;
    const std::string msg = m.status().message();
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << c.what << ": " << msg;
    EXPECT_NE(msg.find("initializer 'W'"), std::string::npos) << c.what << ": " << msg;
    EXPECT_NE(msg.find(c.says), std::string::npos) << c.what << ": " << msg;
    if (std::string(c.what) != "not a count" && std::string(c.what) != "absolute" &&
        std::string(c.what).find("leaves") == std::string::npos)
      EXPECT_NE(msg.find(c.location), std::string::npos) << c.what << ": " << msg;  // the path named
  }
  fs::remove_all(folder);
}

int64_t RssKiB() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

// A model whose weights pass 2 GiB (a table of 2.2 GB in a sparse external file, three of its
// rows written): it loads without reading the table (its pages are mapped, not copied: RSS grows
// by far less than the table) and a Gather reads the written rows.
TEST(ExternalData, ModelsOver2GBLoadMapped) {
  const fs::path folder = TempFolder("large");
  const int64_t rows = 8'600'000, cols = 64;
  const int64_t table_bytes = rows * cols * 4;
  ASSERT_GT(table_bytes, int64_t{1} << 31);
  const int64_t offset = 4096;
  const std::vector<int64_t> ids = {0, rows / 2 + 3, rows - 1};
  {
    const std::string path = (folder / "model.onnx.data").string();
    const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, offset + table_bytes), 0) << "a sparse file of " << table_bytes << " bytes";
    for (int64_t id : ids) {
      std::vector<float> row(cols);
      for (int64_t j = 0; j < cols; ++j) row[static_cast<size_t>(j)] = static_cast<float>(id % 1000) + 0.5f * j;
      ASSERT_EQ(::pwrite(fd, row.data(), row.size() * 4, offset + id * cols * 4), static_cast<ssize_t>(row.size() * 4));
    }
    ::close(fd);
  }
  ModelBuilder b;
  b.Input("ids", {3}, onnx::TensorProto::INT64);
  onnx::TensorProto* t = b.FloatInit("table", {rows, cols}, {});
  MakeExternal(t, "model.onnx.data", offset, table_bytes);
  b.Node("Gather", {"table", "ids"}, {"y"}, "gather");
  b.Output("y");
  WriteFile(folder / "model.onnx", b.m.SerializeAsString());

  const int64_t before = RssKiB();
  auto model = Model::FromOnnxFile((folder / "model.onnx").string());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto compiled = CompiledModel::Compile(std::move(*model), MakeTarget("cpu").value());
  ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
  Tensor in = Tensor::Empty(DType::kI64, {3}).value();
  for (size_t i = 0; i < ids.size(); ++i) in.data_as<int64_t>()[i] = ids[i];
  const TensorView views[] = {in.view()};
  auto out = (*compiled)->Run(views);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_LT(RssKiB() - before, 256 * 1024) << "the table was read, not mapped";
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t j = 0; j < cols; ++j)
      ASSERT_EQ((*out)[0].data_as<float>()[static_cast<int64_t>(i) * cols + j],
                static_cast<float>(ids[i] % 1000) + 0.5f * j)
          << "row " << ids[i] << ", column " << j;
  fs::remove_all(folder);
}

}  // namespace
}  // namespace graphfuse
