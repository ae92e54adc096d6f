// The cuda platform (CUDA torch tensors, docs/cuda.md): whether this build has the CUDA backend,
// how many devices it sees, and the step every "cuda" dispatch takes first. The backend is
// registered on the global registry the first time it is asked for, and only where a device
// exists: the registry is never handed a backend it cannot load.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <tuple>

#include "detlogp/errors.hpp"
#include "python_bindings.hpp"

#ifdef DETLOGP_HAVE_CUDA
#include "detlogp/cuda.hpp"
#include "detlogp/cuda_registry.hpp"
#endif

namespace py = pybind11;

namespace {

// (built with CUDA, device count, why none).
std::tuple<bool, int, std::string> cuda_backend_status() {
#ifdef DETLOGP_HAVE_CUDA
  std::string why;
  const int n = detlogp::cuda_device_count(&why);
  return {true, n, why};
#else
  return {false, 0, "built without CUDA"};
#endif
}

}  // namespace

namespace detlogp_python {

void ensure_cuda_platform() {
#ifdef DETLOGP_HAVE_CUDA
  std::string why;
  if (detlogp::cuda_device_count(&why) == 0) {
    throw detlogp::ContractError("CUDA logits: no CUDA device (" + why + ")");
  }
  detlogp::ensure_cuda_backend_registered();
#else
  throw detlogp::ContractError(
      "CUDA logits need the CUDA backend, but this detlogp was built without CUDA (no CUDA "
      "compiler, or DETLOGP_WITH_CUDA=OFF); pass CPU tensors or rebuild with CUDA");
#endif
}

void bind_cuda(py::module_& m) {
#ifdef DETLOGP_HAVE_CUDA
  m.attr("CUDA_BUILT") = true;
  m.attr("CUDA_CANONICAL_BACKEND_ID") = std::string(detlogp::kCudaCanonicalBackendId);
#else
  m.attr("CUDA_BUILT") = false;
  m.attr("CUDA_CANONICAL_BACKEND_ID") = py::none();
#endif
  m.def("cuda_backend_status", &cuda_backend_status);
}

}  // namespace detlogp_python
