// The operator's checks that run before it looks at the communicator (detlogp::
// check_forward_inputs): the Python package runs them when it cannot build a communicator (no
// process group), so that a contract or shape problem is reported first, as forward does.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <span>
#include <string>

#include "detlogp/contract.hpp"
#include "detlogp/enums.hpp"
#include "detlogp/operator.hpp"
#include "python_bindings.hpp"

namespace py = pybind11;

namespace detlogp_python {

void bind_validation(py::module_& m) {
  using I64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
  m.def(
      "check_forward_inputs",
      [](uintptr_t ptr, const std::string& dtype, int64_t rows, int64_t cols, int64_t row_stride,
         const I64Array& targets, const detlogp::LogprobContract& contract, bool deterministic) {
        const detlogp::LogitsView view{.data = reinterpret_cast<const void*>(ptr),
                                       .dtype = detlogp::parse_dtype(dtype, "local_logits dtype"),
                                       .rows = rows,
                                       .cols = cols,
                                       .row_stride = row_stride};
        const std::span<const int64_t> tg(targets.data(), static_cast<std::size_t>(targets.size()));
        detlogp::check_forward_inputs(view, tg, contract, {.deterministic = deterministic});
      },
      py::kw_only(), py::arg("ptr"), py::arg("dtype"), py::arg("rows"), py::arg("cols"),
      py::arg("row_stride"), py::arg("targets"), py::arg("contract"), py::arg("deterministic"));
}

}  // namespace detlogp_python
