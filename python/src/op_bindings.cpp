// The logits operator (include/detlogp/operator.hpp) and its dispatch (include/detlogp/
// registry.hpp) for python/detlogp/_call.py and _op.py: a LogprobOp's forward on a raw view of
// the caller's logits (never copied; the returned ForwardHandle keeps the view's owner alive
// until backward is done) and its backward into a caller-provided gradient buffer. Forward and
// backward run without the GIL; a torch.distributed communicator takes it back only inside
// its collectives. The Python package has checked and converted every input once before it
// gets here (python/detlogp/_buffers.py), and failed its peers itself where that raised.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/errors.hpp"
#include "detlogp/operator.hpp"
#include "detlogp/registry.hpp"
#include "python_bindings.hpp"
#include "raw_views.hpp"

namespace py = pybind11;

namespace {

using detlogp::Communicator;
using detlogp::ContractError;
using detlogp::LogprobContract;
using detlogp::LogprobOp;
using detlogp_python::F32Array;
using detlogp_python::I32Array;
using detlogp_python::I64Array;
using detlogp_python::kept_options;
using detlogp_python::RawView;
using detlogp_python::span_of;
using detlogp_python::to_numpy;

constexpr const char* kLogitsDtype = "local_logits dtype";

// The result of one forward: outputs, backward's saved state and the owner of the logits.
struct ForwardHandle {
  std::shared_ptr<const LogprobOp> op;
  detlogp::LogprobResult result;
  py::object logits_owner;  // keeps the caller's logits buffer alive
  bool entropy = false;
};

std::shared_ptr<ForwardHandle> run_forward(
    const std::shared_ptr<LogprobOp>& op, const RawView& logits, py::object owner,
    const I64Array& targets, const LogprobContract& contract,
    const std::shared_ptr<Communicator>& comm, bool deterministic, bool validate, bool entropy,
    int threads, bool entropy_grad, const std::string& rows_layout,
    const std::optional<F32Array>& row_temperature, const std::optional<I64Array>& kept_ids,
    bool outside_neg_inf, const std::optional<I32Array>& top_k,
    const std::optional<F32Array>& top_p, bool empty_kept_full) {
  if (!op) throw ContractError("op must be a LogprobOp");
  const detlogp::LogitsView view = detlogp_python::view_of(logits, kLogitsDtype);
  const detlogp::ForwardOptions opt{
      .deterministic = deterministic,
      .validate = validate,
      .entropy = entropy,
      .entropy_grad = entropy_grad,
      .exec = {.threads = threads},
      .rows_layout = rows_layout,
      .row_temperature = span_of(row_temperature),
      .kept = kept_options(kept_ids, outside_neg_inf, top_k, top_p, empty_kept_full)};
  if (row_temperature && row_temperature->ndim() != 1) {
    throw ContractError("row_temperature must be 1-D [rows]");
  }
  auto handle = std::make_shared<ForwardHandle>();
  handle->op = op;
  handle->logits_owner = std::move(owner);
  handle->entropy = entropy;
  {
    py::gil_scoped_release nogil;
    detlogp::SelfComm self;
    Communicator& c = comm ? *comm : static_cast<Communicator&>(self);
    handle->result = op->forward(view, span_of(targets), contract, c, opt);
  }
  return handle;
}

void run_backward(ForwardHandle& h, const std::optional<F32Array>& grad_logp,
                  const std::optional<F32Array>& grad_lse,
                  const std::optional<F32Array>& grad_entropy, const RawView& out) {
  const detlogp::MutableLogitsView grad = detlogp_python::mutable_view_of(out, kLogitsDtype);
  for (const auto* g : {&grad_logp, &grad_lse, &grad_entropy}) {
    if (*g && (*g)->ndim() != 1) throw ContractError("incoming gradients must be 1-D [tokens]");
  }
  const detlogp::LogprobGrads grads{.grad_logp = span_of(grad_logp),
                                    .grad_lse = span_of(grad_lse),
                                    .grad_entropy = span_of(grad_entropy)};
  py::gil_scoped_release nogil;
  h.op->backward(h.result, grads, grad);
}

// A test hook: the same forward run by the C++ library alone, TP ranks as threads of an
// InProcessGroup (no Python in the loop). Returns each rank's (logp, lse, entropy).
py::list in_process_forward(
    const std::shared_ptr<LogprobOp>& op, const std::string& dtype,
    const std::vector<std::tuple<uintptr_t, int64_t, int64_t, int64_t>>& shards,
    const std::vector<LogprobContract>& contracts, const I64Array& targets, bool deterministic,
    bool entropy) {
  if (shards.size() != contracts.size() || shards.empty()) {
    throw ContractError("in_process_forward needs one shard per contract");
  }
  const int n = static_cast<int>(shards.size());
  std::vector<detlogp::LogprobResult> results(static_cast<std::size_t>(n));
  {
    py::gil_scoped_release nogil;
    detlogp::run_ranks(n, [&](Communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      const auto& [ptr, rows, cols, stride] = shards[r];
      const RawView shard{ptr, dtype, rows, cols, stride};
      results[r] =
          op->forward(detlogp_python::view_of(shard, kLogitsDtype), span_of(targets), contracts[r],
                      comm, {.deterministic = deterministic, .entropy = entropy});
    });
  }
  py::list out;
  for (const auto& r : results) {
    out.append(py::make_tuple(to_numpy(r.logp), to_numpy(r.lse), to_numpy(r.entropy)));
  }
  return out;
}

}  // namespace

namespace detlogp_python {

void bind_op(py::module_& m) {
  py::class_<ForwardHandle, std::shared_ptr<ForwardHandle>> handle(m, "ForwardHandle");
  detlogp_python::def_token_outputs<ForwardHandle>(handle);
  handle
      .def_property_readonly("logits_owner", [](const ForwardHandle& h) { return h.logits_owner; })
      // The address of the logits buffer backward will read (the caller's, never a copy).
      .def_property_readonly(
          "saved_logits_data_ptr",
          [](const ForwardHandle& h) -> uintptr_t {
            return reinterpret_cast<uintptr_t>(detlogp::saved_logits(h.result).data);
          })
      .def_property_readonly("saved_logits_row_stride",
                             [](const ForwardHandle& h) -> int64_t {
                               return detlogp::saved_logits(h.result).row_stride;
                             })
      .def("backward", &run_backward, py::kw_only(), py::arg("grad_logp"), py::arg("grad_lse"),
           py::arg("grad_entropy"), py::arg("out"));

  py::class_<LogprobOp, std::shared_ptr<LogprobOp>>(m, "LogprobOp")
      .def_property_readonly("backend_id", &LogprobOp::backend_id)
      .def_property_readonly("kernel_name", &LogprobOp::kernel_name)
      .def("forward", &run_forward, py::kw_only(), py::arg("logits"), py::arg("owner"),
           py::arg("targets"), py::arg("contract"), py::arg("comm"), py::arg("deterministic"),
           py::arg("validate"), py::arg("entropy"), py::arg("threads"), py::arg("entropy_grad"),
           py::arg("rows_layout"), py::arg("row_temperature") = py::none(),
           py::arg("kept_ids") = py::none(), py::arg("outside_neg_inf") = false,
           py::arg("top_k") = py::none(), py::arg("top_p") = py::none(),
           py::arg("empty_kept_full") = false);

  m.def("in_process_forward", &in_process_forward, py::kw_only(), py::arg("op"), py::arg("dtype"),
        py::arg("shards"), py::arg("contracts"), py::arg("targets"), py::arg("deterministic"),
        py::arg("entropy"));

  // The operator's checks that run before it looks at the communicator: the Python package
  // runs them when it cannot build a communicator (no process group), so that a contract or
  // shape problem is reported first, as forward does.
  m.def(
      "check_forward_inputs",
      [](const RawView& logits, const I64Array& targets, const LogprobContract& contract,
         bool deterministic) {
        detlogp::check_forward_inputs(view_of(logits, kLogitsDtype), span_of(targets), contract,
                                      {.deterministic = deterministic});
      },
      py::kw_only(), py::arg("logits"), py::arg("targets"), py::arg("contract"),
      py::arg("deterministic"));
}

void bind_dispatch(py::module_& m) {
  py::class_<detlogp::DispatchResult>(m, "DispatchResult")
      .def_readonly("op", &detlogp::DispatchResult::op)
      .def_readonly("capability", &detlogp::DispatchResult::capability)
      .def_readonly("requested_backend", &detlogp::DispatchResult::requested_backend)
      .def_readonly("actual_backend", &detlogp::DispatchResult::actual_backend)
      .def_readonly("backend_name", &detlogp::DispatchResult::backend_name)
      .def_readonly("platform", &detlogp::DispatchResult::platform)
      .def_readonly("fallback", &detlogp::DispatchResult::fallback)
      .def_readonly("prior_rejections", &detlogp::DispatchResult::prior_rejections)
      .def_readonly("provenance_json", &detlogp::DispatchResult::provenance_json);
  m.def(
      "get_logprob_op",
      [](const LogprobContract& contract, const std::string& requested_backend,
         const std::string& platform) {
        if (platform == "cuda") ensure_cuda_platform();
        return detlogp::Registry::global().get_logprob_op(contract, requested_backend, platform);
      },
      py::arg("contract"), py::arg("requested_backend"), py::arg("platform") = "cpu",
      // Without the GIL while it waits for the registry's lock: a Python backend's factory
      // (run under that lock) takes the GIL itself.
      py::call_guard<py::gil_scoped_release>());
}

}  // namespace detlogp_python
