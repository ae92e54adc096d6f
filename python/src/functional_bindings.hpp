#pragma once
// Bindings of the functional torch API, added to the _detlogp module by detlogp_ext.cpp.

#include <pybind11/pybind11.h>

namespace detlogp::python {

void bind_functional(pybind11::module_& m);

}  // namespace detlogp::python
