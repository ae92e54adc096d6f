// _detlogp: the pybind11 layer under the Python package `detlogp` (docs/python.md).
//
// This module is private: the pure-Python package (python/detlogp/) does the Python-side
// checks (docs/python.md; bools are not integers, mask elements must be real bools, ...) and
// turns NumPy arrays and torch tensors into raw views (raw_views.hpp). Everything else is
// validated here by the C++ library, with its messages:
//   detlogp::ContractError -> detlogp.LogprobContractError (a ValueError subclass)
//   std::runtime_error     -> RuntimeError
// Enums cross this boundary as their value strings and are parsed by detlogp::parse_enum.
// Each subject binds itself in its own file (python_bindings.hpp lists them).

#include <pybind11/pybind11.h>

#include "python_bindings.hpp"

PYBIND11_MODULE(_detlogp, m) {
  m.doc() = "detlogp C++ bindings (private; use the `detlogp` package)";
  using namespace detlogp_python;
  bind_errors(m);
  bind_constants(m);
  bind_enums(m);
  bind_contract(m);
  bind_capability(m);
  bind_comm(m);
  bind_op(m);
  bind_dispatch(m);
  bind_registry(m);
  bind_fused(m);
  bind_cuda(m);
  bind_drift(m);
  bind_memory(m);
  bind_sample(m);
}
