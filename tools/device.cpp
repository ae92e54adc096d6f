#include "device.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>

#include "cli.hpp"
#include "detlogp/registry.hpp"

#ifdef DETLOGP_HAVE_CUDA
#include <cuda_runtime.h>

#include "detlogp/cuda.hpp"
#include "detlogp/cuda_registry.hpp"
#endif

namespace detlogp::cli {
namespace {

#ifdef DETLOGP_HAVE_CUDA
void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(fmt::format("{}: {}", what, cudaGetErrorString(err)));
  }
}
#else
[[noreturn]] void no_cuda() {
  throw UsageError(
      "--device cuda: this detlogp was built without CUDA (no CUDA compiler, or "
      "DETLOGP_WITH_CUDA=OFF)");
}
#endif

}  // namespace

Device parse_device(const std::string& text, const std::string& option) {
  if (text == "cpu") return Device::cpu;
  if (text == "cuda") return Device::cuda;
  throw UsageError(fmt::format("{} must be cpu or cuda; got '{}'", option, text));
}

const char* platform_of(Device device) { return device == Device::cuda ? "cuda" : "cpu"; }

void init_device(Device device) {
  if (device == Device::cpu) return;
#ifdef DETLOGP_HAVE_CUDA
  std::string why;
  if (cuda_device_count(&why) == 0) {
    throw UsageError(fmt::format("--device cuda: no CUDA device ({})", why));
  }
  ensure_cuda_backend_registered();
#else
  no_cuda();
#endif
}

std::string canonical_backend_id(Device device) {
  if (device == Device::cpu) return std::string(kCpuCanonicalBackendId);
#ifdef DETLOGP_HAVE_CUDA
  return std::string(kCudaCanonicalBackendId);
#else
  no_cuda();
#endif
}

std::string device_description(Device device) {
  if (device == Device::cpu) return "cpu";
#ifdef DETLOGP_HAVE_CUDA
  int index = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&index) == cudaSuccess &&
      cudaGetDeviceProperties(&prop, index) == cudaSuccess) {
    return fmt::format("cuda:{} ({})", index, prop.name);
  }
  cudaGetLastError();
#endif
  return "cuda";
}

DeviceBuffer::DeviceBuffer(Device device, std::size_t bytes) : device_(device), bytes_(bytes) {
  if (bytes == 0) return;
  if (device == Device::cpu) {
    data_ = std::malloc(bytes);
    if (data_ == nullptr) throw std::bad_alloc();
    return;
  }
#ifdef DETLOGP_HAVE_CUDA
  const cudaError_t err = cudaMalloc(&data_, bytes);
  if (err != cudaSuccess) {
    data_ = nullptr;
    cudaGetLastError();
    throw UsageError(
        fmt::format("--device cuda: cudaMalloc of {:.1f} GB failed ({}): use fewer "
                    "--tokens",
                    static_cast<double>(bytes) / 1e9, cudaGetErrorString(err)));
  }
#else
  no_cuda();
#endif
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(other.device_),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    device_ = other.device_;
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::release() noexcept {
  if (data_ == nullptr) return;
  if (device_ == Device::cpu) {
    std::free(data_);
  } else {
#ifdef DETLOGP_HAVE_CUDA
    cudaFree(data_);
#endif
  }
  data_ = nullptr;
  bytes_ = 0;
}

void DeviceBuffer::upload(const void* host, std::size_t bytes) {
  if (bytes > bytes_) throw std::logic_error("DeviceBuffer::upload: too many bytes");
  if (bytes == 0) return;
  if (device_ == Device::cpu) {
    std::memcpy(data_, host, bytes);
    return;
  }
#ifdef DETLOGP_HAVE_CUDA
  check(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (upload)");
#endif
}

void DeviceBuffer::download(void* host, std::size_t bytes) const {
  if (bytes > bytes_) throw std::logic_error("DeviceBuffer::download: too many bytes");
  if (bytes == 0) return;
  if (device_ == Device::cpu) {
    std::memcpy(host, data_, bytes);
    return;
  }
#ifdef DETLOGP_HAVE_CUDA
  check(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (download)");
#endif
}

void DeviceBuffer::fill(int value) {
  if (bytes_ == 0) return;
  if (device_ == Device::cpu) {
    std::memset(data_, value, bytes_);
    return;
  }
#ifdef DETLOGP_HAVE_CUDA
  check(cudaMemset(data_, value, bytes_), "cudaMemset");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (memset)");
#endif
}

void DeviceBuffer::copy_from(const DeviceBuffer& src, std::size_t bytes) {
  if (bytes > bytes_ || bytes > src.bytes_) {
    throw std::logic_error("DeviceBuffer::copy_from: too many bytes");
  }
  if (bytes == 0) return;
  if (device_ == Device::cpu) {
    std::memcpy(data_, src.data_, bytes);
    return;
  }
#ifdef DETLOGP_HAVE_CUDA
  check(cudaMemcpy(data_, src.data_, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy (D2D)");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (D2D)");
#endif
}

}  // namespace detlogp::cli
