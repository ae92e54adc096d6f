// Bindings of the fused lm_head (include/detlogp/fused.hpp) for python/detlogp/_fused.py:
// linear_logits, the fused forward (a FusedHandle keeping the hidden states' and weight's
// owners alive) and its backward into caller-provided gradient buffers. Views are raw
// (address, dtype, rows, cols, row_stride) tuples built by the Python side; nothing is copied.
// Forward and backward run without the GIL (a torch.distributed communicator takes it back
// inside its collectives).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/enums.hpp"
#include "detlogp/errors.hpp"
#include "detlogp/fused.hpp"
#include "python_bindings.hpp"

namespace py = pybind11;

namespace {

using View = std::tuple<uintptr_t, std::string, int64_t, int64_t, int64_t>;
using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;
using I64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

detlogp::LogitsView view_of(const View& v, const char* name) {
  const auto& [ptr, dtype, rows, cols, stride] = v;
  return detlogp::LogitsView{.data = reinterpret_cast<const void*>(ptr),
                             .dtype = detlogp::parse_dtype(dtype, name),
                             .rows = rows,
                             .cols = cols,
                             .row_stride = stride};
}

detlogp::MutableLogitsView mutable_view_of(const std::optional<View>& v, const char* name) {
  if (!v) return {};
  const detlogp::LogitsView c = view_of(*v, name);
  return detlogp::MutableLogitsView{.data = const_cast<void*>(c.data),
                                    .dtype = c.dtype,
                                    .rows = c.rows,
                                    .cols = c.cols,
                                    .row_stride = c.row_stride};
}

py::array_t<float> to_numpy(const std::vector<float>& v) {
  py::array_t<float> out(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(out.mutable_data(), v.data(), v.size() * sizeof(float));
  return out;
}

std::span<const float> span_of(const std::optional<F32Array>& a) {
  if (!a) return {};
  return {a->data(), static_cast<std::size_t>(a->size())};
}

struct FusedHandle {
  std::shared_ptr<detlogp::FusedLinearLogprob> op;
  detlogp::FusedLogprobResult result;
  py::object owners;  // keeps the hidden states' and weight's buffers alive
  std::shared_ptr<detlogp::Communicator> comm;  // null: a group of one
  bool entropy = false;
};

void with_comm(const std::shared_ptr<detlogp::Communicator>& comm,
               const std::function<void(detlogp::Communicator&)>& fn) {
  detlogp::SelfComm self;
  fn(comm ? *comm : static_cast<detlogp::Communicator&>(self));
}

std::shared_ptr<FusedHandle> fused_forward(const View& hidden, const View& weight,
                                           py::object owners, const I64Array& targets,
                                           const detlogp::LogprobContract& contract,
                                           const std::shared_ptr<detlogp::Communicator>& comm,
                                           bool entropy, bool validate, int threads,
                                           const std::string& kernel) {
  auto h = std::make_shared<FusedHandle>();
  h->op = std::make_shared<detlogp::FusedLinearLogprob>(kernel);
  h->owners = std::move(owners);
  h->comm = comm;
  h->entropy = entropy;
  const detlogp::LogitsView hv = view_of(hidden, "hidden dtype");
  const detlogp::LogitsView wv = view_of(weight, "weight dtype");
  const std::span<const int64_t> tg(targets.data(), static_cast<std::size_t>(targets.size()));
  py::gil_scoped_release nogil;
  with_comm(comm, [&](detlogp::Communicator& c) {
    h->result =
        h->op->forward(hv, wv, tg, contract, c,
                       {.validate = validate, .entropy = entropy, .exec = {.threads = threads}});
  });
  return h;
}

void fused_backward(FusedHandle& h, const std::optional<F32Array>& grad_logp,
                    const std::optional<F32Array>& grad_lse,
                    const std::optional<F32Array>& grad_entropy,
                    const std::optional<View>& grad_hidden,
                    const std::optional<View>& grad_weight) {
  const detlogp::LogprobGrads grads{.grad_logp = span_of(grad_logp),
                                    .grad_lse = span_of(grad_lse),
                                    .grad_entropy = span_of(grad_entropy)};
  const auto gh = mutable_view_of(grad_hidden, "grad_hidden dtype");
  const auto gw = mutable_view_of(grad_weight, "grad_weight dtype");
  py::gil_scoped_release nogil;
  with_comm(h.comm, [&](detlogp::Communicator& c) { h.op->backward(h.result, grads, gh, gw, c); });
}

void linear_logits(const View& hidden, const View& weight, const View& out, int threads,
                   const std::string& kernel) {
  const auto hv = view_of(hidden, "hidden dtype");
  const auto wv = view_of(weight, "weight dtype");
  const auto ov = mutable_view_of(out, "out dtype");
  py::gil_scoped_release nogil;
  detlogp::linear_logits(hv, wv, ov, {.threads = threads}, kernel);
}

}  // namespace

namespace detlogp_python {

void bind_fused(py::module_& m) {
  py::class_<FusedHandle, std::shared_ptr<FusedHandle>>(m, "FusedHandle")
      .def_property_readonly("logp", [](const FusedHandle& h) { return to_numpy(h.result.logp); })
      .def_property_readonly("lse", [](const FusedHandle& h) { return to_numpy(h.result.lse); })
      .def_property_readonly("entropy",
                             [](const FusedHandle& h) -> py::object {
                               if (!h.entropy) return py::none();
                               return to_numpy(h.result.entropy);
                             })
      .def_property_readonly("kernel_name",
                             [](const FusedHandle& h) { return h.op->kernel_name(); })
      .def("backward", &fused_backward, py::kw_only(), py::arg("grad_logp"), py::arg("grad_lse"),
           py::arg("grad_entropy"), py::arg("grad_hidden"), py::arg("grad_weight"));
  m.def("fused_forward", &fused_forward, py::kw_only(), py::arg("hidden"), py::arg("weight"),
        py::arg("owners"), py::arg("targets"), py::arg("contract"), py::arg("comm"),
        py::arg("entropy"), py::arg("validate"), py::arg("threads"), py::arg("kernel"));
  m.def("linear_logits", &linear_logits, py::kw_only(), py::arg("hidden"), py::arg("weight"),
        py::arg("out"), py::arg("threads"), py::arg("kernel"));
  m.def("fused_kernel_names", &detlogp::fused_kernel_names);
}

}  // namespace detlogp_python
