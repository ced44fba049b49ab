// A small builder over onnx::ModelProto, for the importer's tests.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graphfuse/graph.h"
#include "onnx/import.h"

namespace graphfuse {

struct ModelBuilder {
  onnx::ModelProto m;
  explicit ModelBuilder(int64_t opset = 17) {
    m.set_ir_version(8);
    auto* o = m.add_opset_import();
    o->set_domain("");
    o->set_version(opset);
    m.mutable_graph()->set_name("t");
  }
  onnx::GraphProto& g() { return *m.mutable_graph(); }
  onnx::ValueInfoProto* Input(const std::string& name, const std::vector<int64_t>& dims,
                              int32_t type = onnx::TensorProto::FLOAT) {
    auto* in = g().add_input();
    in->set_name(name);
    auto* tt = in->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(type);
    tt->mutable_shape();  // a scalar has a shape with no dims (no shape = unknown rank)
    for (int64_t d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
    return in;
  }
  void Output(const std::string& name) { g().add_output()->set_name(name); }
  onnx::TensorProto* FloatInit(const std::string& name, const std::vector<int64_t>& dims, const std::vector<float>& v) {
    auto* t = g().add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    for (float f : v) t->add_float_data(f);
    return t;
  }
  onnx::NodeProto* Node(const std::string& op, const std::vector<std::string>& ins, const std::vector<std::string>& outs,
                        const std::string& name = "") {
    auto* n = g().add_node();
    n->set_op_type(op);
    if (!name.empty()) n->set_name(name);
    for (const auto& i : ins) n->add_input(i);
    for (const auto& o : outs) n->add_output(o);
    return n;
  }
  Result<std::unique_ptr<Graph>> Import() { return ImportOnnxBytes(m.SerializeAsString(), "m.onnx"); }
};

}  // namespace graphfuse
