// Bindings of the functional torch API (python/detlogp/torch.py): a MaskSpec built straight
// from a byte mask, so that a trainer's [tokens] mask tensor becomes a contract without a
// Python list of bools on the way (the list path costs ~100 ms at 262k tokens).

#include "functional_bindings.hpp"

#include <pybind11/numpy.h>

#include <cstdint>
#include <string>
#include <vector>

#include "detlogp/contract.hpp"
#include "detlogp/errors.hpp"

namespace py = pybind11;

namespace detlogp::python {

void bind_functional(py::module_& m) {
  m.def(
      "mask_spec_from_bytes",
      [](const py::array_t<uint8_t, py::array::c_style>& active, int64_t ignore_index) {
        if (active.ndim() != 1) {
          throw ContractError("active_mask must be 1-D with one entry per token; got " +
                              std::to_string(active.ndim()) + " dimensions");
        }
        const uint8_t* p = active.data();
        std::vector<bool> mask(static_cast<std::size_t>(active.size()));
        for (std::size_t i = 0; i < mask.size(); ++i) mask[i] = p[i] != 0;
        return MaskSpec({.num_tokens = static_cast<int64_t>(mask.size()),
                         .active_mask = std::move(mask),
                         .ignore_index = ignore_index});
      },
      py::arg("active"), py::arg("ignore_index"),
      "MaskSpec(num_tokens=len(active), active_mask=active != 0, ignore_index) from a "
      "contiguous uint8 array.");
}

}  // namespace detlogp::python
