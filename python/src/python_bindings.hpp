#pragma once
// The _detlogp extension, one subject per file: detlogp_ext.cpp's module initializer calls
// each bind function once, in this order (the error type first: every later binding may raise
// it). A new subject gets its own python/src/<subject>_bindings.cpp and a name here.
//
//   module_bindings.cpp    bind_errors (LogprobContractError), bind_constants (version,
//                          constants, SIMD targets), bind_enums (every contract enum's values)
//   contract_bindings.cpp  bind_contract (contract types, vocabulary layouts),
//                          bind_capability (BackendCapability)
//   comm_bindings.cpp      bind_comm (communicators, the preflight steps outside the operator)
//   op_bindings.cpp        bind_op (the logits operator), bind_dispatch (its registry dispatch)
//   registry_bindings.cpp  bind_registry (registry objects, backends from factories and Python)
//   fused_bindings.cpp     bind_fused (the fused lm_head and its dispatch)
//   cuda_bindings.cpp      bind_cuda (the cuda platform's status and constants)
//   drift_bindings.cpp     bind_drift (the drift statistics of include/detlogp/drift.hpp)
//   memory_bindings.cpp    bind_memory (the command line's memory rule, for up-front checks)
//   sample_bindings.cpp    bind_sample (the sampler, detlogp/sampler.hpp)

#include <pybind11/pybind11.h>

namespace detlogp_python {

using Binder = void(pybind11::module_& m);

Binder bind_errors, bind_constants, bind_enums, bind_contract, bind_capability, bind_comm, bind_op,
    bind_dispatch, bind_registry, bind_fused, bind_cuda, bind_drift, bind_memory, bind_sample;

// Throws ContractError unless the cuda platform can run; registers its backend once
// (cuda_bindings.cpp). Every dispatch on "cuda" calls it first.
void ensure_cuda_platform();

}  // namespace detlogp_python
