// The C++ registry (include/detlogp/registry.hpp) for the Python package: Registry objects (a
// fresh one, one with the built-in backends, the process-wide one), backends built from a
// factory, and the adapter that lets a Python object with forward/backward be a backend.
//
// Dispatch stays the C++ registry's one implementation: policies, capability matching per
// platform, fallback, provenance, the shared instance cache and the load-failure blacklist. A
// Python-defined backend enters it as a PyBackendOp, a LogprobOp that holds the Python object
// its factory returned; `python_op_of` hands that object back to Python after dispatch. A C++
// caller that dispatches to one (it cannot run Python buffers) gets std::runtime_error from
// forward and backward, never a crash.
//
// The GIL: Python factories run inside Registry::get_logprob_op / get_op (outside the
// registry's lock; a second thread needing the same backend waits for it) and take the GIL
// themselves. Every registry call from Python therefore releases the GIL first: a thread never
// waits for the registry (its lock, or a backend another thread is building) while holding the
// GIL that a factory (which may itself let the GIL go, e.g. in torch code or a sleep) needs.
// Nothing the registry copies or destroys without the GIL holds a Python reference directly
// (PyRef).

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "detlogp/capability.hpp"
#include "detlogp/errors.hpp"
#include "detlogp/kernels.hpp"
#include "detlogp/operator.hpp"
#include "detlogp/registry.hpp"
#include "python_bindings.hpp"

namespace py = pybind11;

namespace {

using detlogp::Backend;
using detlogp::LogprobOp;
using detlogp::Registry;

// A Python reference that C++ containers may copy and destroy without the GIL: the registry
// copies Backend factories under its own lock, and the process-wide registry outlives the
// interpreter. The last owner drops the reference with the GIL, or leaks it once Python is
// shutting down (touching the object then would crash).
class PyRef {
 public:
  explicit PyRef(py::object obj) : obj_(new py::object(std::move(obj))) {}
  ~PyRef() {
    if (!Py_IsInitialized() || _Py_IsFinalizing()) return;  // leaked on purpose at exit
    py::gil_scoped_acquire gil;
    delete obj_;
  }
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  const py::object& get() const { return *obj_; }

 private:
  py::object* obj_;
};

// A backend written in Python: forward and backward live on the Python object, which the
// package calls directly. From C++ it is only a name in the registry.
class PyBackendOp final : public LogprobOp {
 public:
  PyBackendOp(std::shared_ptr<PyRef> obj, std::string backend_id, std::string kernel)
      : obj_(std::move(obj)), backend_id_(std::move(backend_id)), kernel_(std::move(kernel)) {}

  const std::string& backend_id() const override { return backend_id_; }
  std::string kernel_name() const override { return kernel_; }
  const py::object& python_object() const { return obj_->get(); }

  detlogp::LogprobResult forward(const detlogp::LogitsView&, std::span<const int64_t>,
                                 const detlogp::LogprobContract&, detlogp::Communicator&,
                                 const detlogp::ForwardOptions&) const override {
    throw std::runtime_error(not_from_cpp());
  }
  void backward(const detlogp::LogprobResult&, const detlogp::LogprobGrads&,
                const detlogp::MutableLogitsView&) const override {
    throw std::runtime_error(not_from_cpp());
  }

 private:
  std::string not_from_cpp() const {
    return "backend " + backend_id_ +
           " is defined in Python: call the op object the Python registry returns "
           "(its forward/backward), not the C++ LogprobOp";
  }

  std::shared_ptr<PyRef> obj_;
  std::string backend_id_;
  std::string kernel_;
};

// A BaseException that is not an Exception (KeyboardInterrupt, SystemExit) raised by a factory:
// not a load failure but the interpreter stopping. It crosses the C++ registry, which records any
// std::exception from a factory as a load failure, as a type that is no std::exception (the
// registry's locks unwind as usual, nothing is recorded) and is raised again in Python by the
// translator registered in bind_registry.
struct PythonInterrupt {
  py::error_already_set error;
};

std::string attr_or(const py::object& obj, const char* name, const std::string& fallback) {
  if (!py::hasattr(obj, name)) return fallback;
  py::object v = obj.attr(name);
  if (v.is_none()) return fallback;
  return py::str(v);
}

// A Backend whose factory calls `factory()` (with the GIL). It may return a C++ LogprobOp (a
// backend of this library), or any Python object with forward/backward (a Python backend);
// None or an exception counts as a load failure, which the registry records and never retries;
// KeyboardInterrupt and SystemExit propagate (PythonInterrupt).
Backend python_backend(const std::string& name, py::object factory) {
  if (!PyCallable_Check(factory.ptr())) {
    throw detlogp::ContractError("backend factory for " + name +
                                 " must be callable (returning an op object)");
  }
  auto ref = std::make_shared<PyRef>(std::move(factory));
  return Backend{name, [ref, name]() -> std::shared_ptr<LogprobOp> {
                   py::gil_scoped_acquire gil;
                   py::object made;
                   try {
                     made = ref->get()();
                   } catch (py::error_already_set& e) {
                     if (!e.matches(PyExc_Exception)) throw PythonInterrupt{std::move(e)};
                     return nullptr;  // load failure: recorded by the registry
                   }
                   if (made.is_none()) return nullptr;
                   if (py::isinstance<LogprobOp>(made))
                     return made.cast<std::shared_ptr<LogprobOp>>();
                   if (!py::hasattr(made, "forward") || !py::hasattr(made, "backward")) {
                     return nullptr;  // not an op: cannot serve, counts as a load failure
                   }
                   const std::string id = attr_or(made, "backend_id", name);
                   const std::string kernel = attr_or(made, "kernel_name", "python");
                   return std::make_shared<PyBackendOp>(std::make_shared<PyRef>(std::move(made)),
                                                        id, kernel);
                 }};
}

using nogil = py::call_guard<py::gil_scoped_release>;

// Python holds registries through shared_ptr; the process-wide one is never deleted.
std::shared_ptr<Registry> global_registry() {
  return std::shared_ptr<Registry>(&Registry::global(), [](Registry*) {});
}

}  // namespace

namespace detlogp_python {

void bind_registry(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (PythonInterrupt& interrupt) {
      interrupt.error.restore();
    }
  });
  py::class_<Backend>(m, "Backend")
      .def(py::init(&python_backend), py::arg("name"), py::arg("factory"))
      .def_static("cpu", &detlogp::cpu_backend, py::kw_only(), py::arg("name"),
                  py::arg("backend_id"), py::arg("kernels"))
      .def_readonly("name", &Backend::name);

  py::class_<Registry, std::shared_ptr<Registry>>(m, "Registry")
      .def(py::init([] { return std::make_shared<Registry>(); }))
      .def_static("with_builtin_backends",
                  [] { return std::shared_ptr<Registry>(Registry::with_builtin_backends()); })
      .def_static("global_registry", &global_registry)
      .def("register_logprob_backend", &Registry::register_logprob_backend, py::arg("backend"),
           py::arg("capability"), py::arg("platform"), py::arg("prepend"), nogil())
      .def("add_contract_candidate", &Registry::add_contract_candidate, py::arg("backend"),
           py::arg("platform"), nogil())
      .def("register_legacy_backend", &Registry::register_legacy_backend, py::arg("op_type"),
           py::arg("backend"), py::arg("platform"), py::arg("prepend"), nogil())
      .def("get_op", &Registry::get_op, py::arg("op_type"), py::arg("platform"), nogil())
      .def("get_logprob_op", &Registry::get_logprob_op, py::arg("contract"),
           py::arg("requested_backend"), py::arg("platform"), nogil())
      .def(
          "contract_candidates",
          [](const Registry& r, const std::string& platform, const std::string& op_kind) {
            return r.contract_candidates(platform, detlogp::parse_op_kind(op_kind));
          },
          py::arg("platform"), py::arg("op_kind"), nogil())
      .def("legacy_priority", &Registry::legacy_priority, py::arg("op_type"), py::arg("platform"),
           nogil())
      .def("capability", &Registry::capability, py::arg("platform"), py::arg("backend_name"),
           nogil())
      .def("failed_to_load", &Registry::failed_to_load, py::arg("backend_name"), nogil());

  // The Python object behind a Python-defined backend's op, or None for a C++ op.
  m.def(
      "python_op_of",
      [](const std::shared_ptr<LogprobOp>& op) -> py::object {
        if (auto* p = dynamic_cast<const PyBackendOp*>(op.get())) return p->python_object();
        return py::none();
      },
      py::arg("op"));
  py::list platforms;
  for (std::string_view p : detlogp::kPlatforms) platforms.append(std::string(p));
  m.attr("REGISTRY_PLATFORMS") = py::tuple(platforms);
  py::list kinds;
  for (detlogp::OpKind k : detlogp::kOpKinds) kinds.append(std::string(detlogp::to_string(k)));
  m.attr("REGISTRY_OP_KINDS") = py::tuple(kinds);
}

}  // namespace detlogp_python
