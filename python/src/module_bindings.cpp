// What the module says about itself: its error type (detlogp::ContractError as
// detlogp.LogprobContractError, a ValueError), the library's version and constants, the value
// strings of every contract enum (python/detlogp/_enums.py builds its enums from them) and the
// SIMD targets of this build.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <exception>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/enums.hpp"
#include "detlogp/errors.hpp"
#include "detlogp/kernels.hpp"
#include "detlogp/registry.hpp"
#include "detlogp/version.hpp"
#include "python_bindings.hpp"

namespace py = pybind11;

namespace {

template <detlogp::ContractEnum E>
std::vector<std::string> values_of() {
  const auto values = detlogp::enum_values<E>();
  return {values.begin(), values.end()};
}

// Every contract enum: its Python class name and its values, in one order (the one list the
// package's enums come from).
constexpr std::string_view kEnumNames[] = {"Role",           "DType",
                                           "Merge",          "MergeAxis",
                                           "ReductionOrder", "Transport",
                                           "DowncastPoint",  "Engine",
                                           "TPPlacement",    "DeterminismScope",
                                           "MaskMode",       "ImplementationKind"};

template <detlogp::ContractEnum... E>
std::vector<std::string> values_at(std::size_t index) {
  static_assert(sizeof...(E) == std::size(kEnumNames));
  std::vector<std::string> out;
  std::size_t i = 0;
  ((i++ == index ? (void)(out = values_of<E>()) : void()), ...);
  return out;
}

std::vector<std::string> enum_values(std::size_t index) {
  using namespace detlogp;
  return values_at<Role, DType, Merge, MergeAxis, ReductionOrder, Transport, DowncastPoint, Engine,
                   TPPlacement, DeterminismScope, MaskMode, ImplementationKind>(index);
}

}  // namespace

namespace detlogp_python {

void bind_errors(py::module_& m) {
  static py::exception<detlogp::ContractError> contract_error(m, "LogprobContractError",
                                                              PyExc_ValueError);
  contract_error.attr("__doc__") =
      "A contract or input violation (detlogp::ContractError). Subclass of ValueError. "
      "code: the kind of rule broken (e.g. 'out_of_range'), field: the field it is about.";
  contract_error.attr("__module__") = "detlogp";
  // The C++ error's code and field as attributes (class defaults for errors raised in Python).
  contract_error.attr("code") = "unspecified";
  contract_error.attr("field") = "";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const detlogp::ContractError& e) {
      py::object error = py::handle(contract_error.ptr())(e.what());  // an instance
      error.attr("code") = std::string(detlogp::to_string(e.code()));
      error.attr("field") = e.field();
      PyErr_SetObject(contract_error.ptr(), error.ptr());
    }
  });
}

void bind_constants(py::module_& m) {
  // The pybind11 this extension was built with: before 2.12 it cannot read NumPy 2's arrays
  // (detlogp/_native.py refuses that pairing at import).
  m.attr("pybind11_version") = py::make_tuple(PYBIND11_VERSION_MAJOR, PYBIND11_VERSION_MINOR);
  m.def("version", [] { return std::string(detlogp::version()); });
  m.attr("NUMERICS_VERSION") = std::string(detlogp::kNumericsVersion);
  m.attr("DEFAULT_TILE_WIDTH") = detlogp::kDefaultTileWidth;
  m.attr("DEFAULT_COLLECTIVE_TIMEOUT") = detlogp::kDefaultCollectiveTimeoutSeconds;
  m.attr("CPU_CANONICAL_BACKEND_ID") = std::string(detlogp::kCpuCanonicalBackendId);
  m.attr("CPU_REFERENCE_BACKEND_ID") = std::string(detlogp::kCpuReferenceBackendId);
  m.attr("CPU_BATCH_INVARIANT_BACKEND_ID") = std::string(detlogp::kCpuBatchInvariantBackendId);
  m.def("simd_targets", &detlogp::simd_targets);
}

void bind_enums(py::module_& m) {
  m.attr("ENUM_NAMES") = std::vector<std::string>(std::begin(kEnumNames), std::end(kEnumNames));
  m.def("enum_values", [](const std::string& name) {
    for (std::size_t i = 0; i < std::size(kEnumNames); ++i) {
      if (kEnumNames[i] == name) return enum_values(i);
    }
    throw detlogp::ContractError("unknown enum " + name);
  });
}

}  // namespace detlogp_python
