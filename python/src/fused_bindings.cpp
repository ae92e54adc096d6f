// Bindings of the fused lm_head (include/detlogp/fused.hpp) for python/detlogp/_fused.py: its
// dispatch (the op with capability and provenance), linear_logits, the fused forward (a
// FusedHandle keeping the hidden states' and weight's owners alive) and its backward into
// caller-provided gradient buffers. Views are raw view tuples (raw_views.hpp); nothing is copied.
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
#include "detlogp/fused_dispatch.hpp"
#include "python_bindings.hpp"
#include "raw_views.hpp"

namespace py = pybind11;

namespace {

using detlogp_python::F32Array;
using detlogp_python::I32Array;
using detlogp_python::I64Array;
using detlogp_python::kept_options;
using detlogp_python::mutable_view_of;
using detlogp_python::RawView;
using detlogp_python::span_of;
using detlogp_python::to_numpy;
using detlogp_python::view_of;

// What the registry handed out for one contract: the op, its capability and provenance.
struct FusedDispatch {
  detlogp::FusedDispatchResult result;
};

struct FusedHandle {
  std::shared_ptr<const detlogp::FusedLinearLogprob> op;
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

std::shared_ptr<FusedHandle> fused_forward(
    const FusedDispatch& dispatch, const RawView& hidden, const RawView& weight, py::object owners,
    const I64Array& targets, const detlogp::LogprobContract& contract,
    const std::shared_ptr<detlogp::Communicator>& comm, bool entropy, bool validate, int threads,
    const std::optional<F32Array>& row_temperature, const std::optional<I64Array>& kept_ids,
    bool outside_neg_inf, const std::optional<I32Array>& top_k,
    const std::optional<F32Array>& top_p, bool empty_kept_full) {
  if (row_temperature && row_temperature->ndim() != 1) {
    throw detlogp::ContractError("row_temperature must be 1-D [tokens]");
  }
  auto h = std::make_shared<FusedHandle>();
  h->op = dispatch.result.op;
  h->owners = std::move(owners);
  h->comm = comm;
  h->entropy = entropy;
  const detlogp::LogitsView hv = view_of(hidden, "hidden dtype");
  const detlogp::LogitsView wv = view_of(weight, "weight dtype");
  const std::span<const int64_t> tg = span_of(targets);
  const detlogp::KeptSetOptions kept =
      kept_options(kept_ids, outside_neg_inf, top_k, top_p, empty_kept_full);
  py::gil_scoped_release nogil;
  with_comm(comm, [&](detlogp::Communicator& c) {
    h->result = h->op->forward(hv, wv, tg, contract, c,
                               {.validate = validate,
                                .entropy = entropy,
                                .exec = {.threads = threads},
                                .row_temperature = span_of(row_temperature),
                                .kept = kept});
  });
  return h;
}

void fused_backward(FusedHandle& h, const std::optional<F32Array>& grad_logp,
                    const std::optional<F32Array>& grad_lse,
                    const std::optional<F32Array>& grad_entropy,
                    const std::optional<RawView>& grad_hidden,
                    const std::optional<RawView>& grad_weight) {
  const detlogp::LogprobGrads grads{.grad_logp = span_of(grad_logp),
                                    .grad_lse = span_of(grad_lse),
                                    .grad_entropy = span_of(grad_entropy)};
  const auto gh = mutable_view_of(grad_hidden, "grad_hidden dtype");
  const auto gw = mutable_view_of(grad_weight, "grad_weight dtype");
  py::gil_scoped_release nogil;
  with_comm(h.comm, [&](detlogp::Communicator& c) { h.op->backward(h.result, grads, gh, gw, c); });
}

void linear_logits(const RawView& hidden, const RawView& weight, const RawView& out, int threads,
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
  py::class_<FusedDispatch>(m, "FusedDispatch")
      .def_property_readonly("backend_id",
                             [](const FusedDispatch& d) { return d.result.op->backend_id(); })
      .def_property_readonly("kernel_name",
                             [](const FusedDispatch& d) { return d.result.op->kernel_name(); })
      .def_property_readonly("provenance_json",
                             [](const FusedDispatch& d) { return d.result.provenance_json; });
  // Contract dispatch of the fused op kind (include/detlogp/fused_dispatch.hpp): the one way the
  // package obtains a fused op, so its capability is checked and its provenance recorded.
  m.def(
      "get_fused_linear_logprob_op",
      [](const detlogp::LogprobContract& contract, const std::string& kernel) {
        return FusedDispatch{detlogp::get_fused_linear_logprob_op(contract, kernel)};
      },
      py::arg("contract"), py::arg("kernel"));
  py::class_<FusedHandle, std::shared_ptr<FusedHandle>> handle(m, "FusedHandle");
  detlogp_python::def_token_outputs<FusedHandle>(handle);
  handle
      .def_property_readonly("kernel_name",
                             [](const FusedHandle& h) { return h.op->kernel_name(); })
      .def("backward", &fused_backward, py::kw_only(), py::arg("grad_logp"), py::arg("grad_lse"),
           py::arg("grad_entropy"), py::arg("grad_hidden"), py::arg("grad_weight"));
  m.def("fused_forward", &fused_forward, py::kw_only(), py::arg("op"), py::arg("hidden"),
        py::arg("weight"), py::arg("owners"), py::arg("targets"), py::arg("contract"),
        py::arg("comm"), py::arg("entropy"), py::arg("validate"), py::arg("threads"),
        py::arg("row_temperature") = py::none(), py::arg("kept_ids") = py::none(),
        py::arg("outside_neg_inf") = false, py::arg("top_k") = py::none(),
        py::arg("top_p") = py::none(), py::arg("empty_kept_full") = false);
  m.def("linear_logits", &linear_logits, py::kw_only(), py::arg("hidden"), py::arg("weight"),
        py::arg("out"), py::arg("threads"), py::arg("kernel"));
  m.def("fused_kernel_names", &detlogp::fused_kernel_names);
}

}  // namespace detlogp_python
