#pragma once
// The parts of the _detlogp extension that live in their own files; detlogp_ext.cpp calls each
// bind function once from its module initializer.

#include <pybind11/pybind11.h>

namespace detlogp_python {

// Registry objects, backends from factories, Python-defined backends (registry_bindings.cpp).
void bind_registry(pybind11::module_& m);
// The drift statistics of include/detlogp/drift.hpp (drift_bindings.cpp).
void bind_drift(pybind11::module_& m);
// The operator's checks that run before the transport (validation_bindings.cpp).
void bind_validation(pybind11::module_& m);
// The fused lm_head of include/detlogp/fused.hpp (fused_bindings.cpp).
void bind_fused(pybind11::module_& m);
// The command line's memory rule, for up-front checks (memory_bindings.cpp).
void bind_memory(pybind11::module_& m);

}  // namespace detlogp_python
