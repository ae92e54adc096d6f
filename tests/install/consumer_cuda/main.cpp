// A C++ user's program linking the installed CUDA backend (detlogp::cuda): registers it and
// asks for the device count. Without a GPU the count is 0 with a reason; either way the
// backend's capability must name the CUDA backend id.
#include <cstdio>
#include <string>

#include <detlogp/cuda.hpp>
#include <detlogp/cuda_registry.hpp>
#include <detlogp/detlogp.hpp>

int main() {
  detlogp::register_cuda_backend(detlogp::Registry::global());
  std::string why;
  const int devices = detlogp::cuda_device_count(&why);
  const std::string id = detlogp::cuda_capability().backend_id();
  std::printf("detlogp::cuda: %d device(s)%s%s; backend %s\n", devices, why.empty() ? "" : ": ",
              why.c_str(), id.c_str());
  return id == detlogp::kCudaCanonicalBackendId ? 0 : 1;
}
