// The memory rule of the command line's up-front checks (src/memory/memory.hpp), for the Python
// package's own up-front checks (the drift report): one rule, one place.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "memory/memory.hpp"
#include "python_bindings.hpp"

namespace py = pybind11;

namespace detlogp_python {

void bind_memory(py::module_& m) {
  m.def(
      "require_memory",
      [](std::uint64_t needed, const std::string& what, const std::string& fix) {
        detlogp::io::require_memory(needed, what, fix);
      },
      py::arg("needed"), py::arg("what"), py::arg("fix"),
      "RuntimeError '<what> needs N bytes (X GB) but this process has M bytes (Y GB) available "
      "(<source>); <fix>' unless `needed` bytes fit in the memory available to this process "
      "(cgroup limits and MemAvailable; DETLOGP_TESTING_MEMORY_LIMIT replaces them).");
  m.def(
      "checked_product",
      [](const std::vector<std::uint64_t>& factors, const std::string& what) {
        return detlogp::io::checked_product(factors, what);
      },
      py::arg("factors"), py::arg("what"),
      "The product of `factors`, or LogprobContractError '<what> overflows 64-bit sizes (...)'.");
  m.def(
      "available_memory",
      [] {
        const detlogp::io::AvailableMemory a = detlogp::io::available_memory();
        const py::object bytes = a.known ? py::object(py::int_(a.bytes)) : py::object(py::none());
        return py::make_tuple(bytes, a.source);
      },
      "(bytes, source) this process may still allocate; (None, '') when nothing could be read.");
}

}  // namespace detlogp_python
