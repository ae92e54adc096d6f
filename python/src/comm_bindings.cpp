// Communicators (include/detlogp/comm.hpp) for python/detlogp/_comm.py: the base type, the group
// of one, a communicator whose collectives call back into Python (a torch.distributed process
// group), and the preflight steps a rank takes without running the operator (it failed its own
// checks, or it has no tokens).

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>

#include "detlogp/comm.hpp"
#include "detlogp/errors.hpp"
#include "detlogp/operator.hpp"
#include "python_bindings.hpp"

namespace py = pybind11;

namespace {

using detlogp::Communicator;
using detlogp::ContractError;

// A Communicator whose collectives call back into Python (a torch.distributed process group,
// see python/detlogp/_comm.py). The operator calls it with the GIL released; every callback
// takes the GIL for its duration and turns a Python exception into std::runtime_error (never
// lets a py::error_already_set travel through the C++ operator).

class PyCallbackComm final : public Communicator {
 public:
  // all_gather_fn(send: bytes) returns every rank's send bytes in rank order (bytes of size x
  // len(send)); barrier_fn() returns once every rank has entered it. One call into Python per
  // collective: the bytes are few (a handful per token), so copying them in and out costs
  // less than exporting this rank's buffers as views and releasing them again afterwards.
  PyCallbackComm(int rank, int size, std::string name, py::function all_gather_fn,
                 py::function barrier_fn)
      : rank_(rank),
        size_(size),
        name_(std::move(name)),
        all_gather_fn_(std::move(all_gather_fn)),
        barrier_fn_(std::move(barrier_fn)) {
    if (size_ < 1 || rank_ < 0 || rank_ >= size_) {
      throw ContractError("communicator rank=" + std::to_string(rank_) +
                          " and size=" + std::to_string(size_) + " must satisfy 0 <= rank < size");
    }
  }

  ~PyCallbackComm() override {
    py::gil_scoped_acquire gil;
    all_gather_fn_ = py::function();
    barrier_fn_ = py::function();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  void barrier() override {
    py::gil_scoped_acquire gil;
    try {
      barrier_fn_();
    } catch (py::error_already_set& e) {
      throw std::runtime_error(transport_failure(e, "barrier"));
    }
  }

 protected:
  void do_all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                     bool /*in_place: send is copied before anything is received*/) override {
    py::gil_scoped_acquire gil;
    try {
      const py::bytes sent(reinterpret_cast<const char*>(send.data()), send.size());
      const py::object got = all_gather_fn_(sent);
      if (!py::isinstance<py::bytes>(got)) {
        throw std::runtime_error(name_ + " all_gather failed on rank " + std::to_string(rank_) +
                                 ": the callback returned " +
                                 std::string(py::str(py::type::handle_of(got).attr("__name__"))) +
                                 ", expected bytes");
      }
      const auto size = static_cast<std::size_t>(PyBytes_GET_SIZE(got.ptr()));
      if (size != recv.size()) {
        throw std::runtime_error(name_ + " all_gather failed on rank " + std::to_string(rank_) +
                                 ": the callback returned " + std::to_string(size) +
                                 " bytes, expected " + std::to_string(recv.size()) + " (" +
                                 std::to_string(size_) + " ranks x " + std::to_string(send.size()) +
                                 ")");
      }
      if (size != 0) std::memcpy(recv.data(), PyBytes_AS_STRING(got.ptr()), size);
    } catch (py::error_already_set& e) {
      throw std::runtime_error(transport_failure(e, "all_gather"));
    }
  }

 private:
  // A RuntimeError is the transport's own report (TorchDistributedComm names the collective,
  // the rank and the cause first): passed on as it is. Anything else is a fault in the
  // callback, prefixed with where it happened.
  std::string transport_failure(py::error_already_set& e, const char* collective) const {
    if (e.matches(PyExc_RuntimeError)) return py::str(e.value());
    return name_ + " " + collective + " failed on rank " + std::to_string(rank_) + ": " + e.what();
  }

  int rank_;
  int size_;
  std::string name_;
  py::function all_gather_fn_;
  py::function barrier_fn_;
};

}  // namespace

namespace detlogp_python {

void bind_comm(py::module_& m) {
  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("name", &Communicator::name)
      .def("barrier", &Communicator::barrier, py::call_guard<py::gil_scoped_release>())
      // bytes in, every rank's bytes out (for tests of a communicator on its own).
      .def("all_gather", [](Communicator& c, const py::bytes& send) {
        const std::string s = send;
        std::string recv(s.size() * static_cast<std::size_t>(c.size()), '\0');
        {
          py::gil_scoped_release nogil;
          c.all_gather(std::as_bytes(std::span<const char>(s.data(), s.size())),
                       std::as_writable_bytes(std::span<char>(recv.data(), recv.size())));
        }
        return py::bytes(recv);
      });
  // A rank whose inputs failed its own checks joins the others' preflight so all of them raise.
  m.def(
      "fail_preflight",
      [](const std::shared_ptr<Communicator>& comm, const std::string& message) {
        if (!comm) throw ContractError(message);
        py::gil_scoped_release nogil;
        detlogp::fail_preflight(*comm, message);
      },
      py::arg("comm"), py::arg("message"));
  // A rank with no tokens joins the others' preflight with zero rows (an empty micro-batch).
  m.def(
      "preflight_no_tokens",
      [](const std::shared_ptr<Communicator>& comm) {
        if (!comm) return;
        py::gil_scoped_release nogil;
        detlogp::preflight_no_tokens(*comm);
      },
      py::arg("comm"));
  py::class_<detlogp::SelfComm, Communicator, std::shared_ptr<detlogp::SelfComm>>(m, "SelfComm")
      .def(py::init<>());
  py::class_<PyCallbackComm, Communicator, std::shared_ptr<PyCallbackComm>>(m, "CallbackComm")
      .def(py::init<int, int, std::string, py::function, py::function>(), py::arg("rank"),
           py::arg("size"), py::arg("name"), py::arg("all_gather"), py::arg("barrier"));
}

}  // namespace detlogp_python
