#pragma once
// `--device cpu|cuda` of `run`, `logprob` and `bench` (docs/cli.md, docs/cuda.md): where the
// logits and the gradient live and which registry platform dispatches the contract. The cuda
// device exists only when the tools are built with the CUDA backend (DETLOGP_HAVE_CUDA: the
// detlogp_cuda target exists); the CPU-only build keeps the option and refuses `cuda`.
//
// DeviceBuffer holds the logits (or the gradient) on the device: host memory for cpu,
// cudaMalloc'ed memory of the current CUDA device for cuda. Every transfer is synchronous.

#include <cstddef>
#include <string>

namespace detlogp::cli {

enum class Device { cpu, cuda };

// "cpu" / "cuda"; UsageError naming `option` for anything else.
Device parse_device(const std::string& text, const std::string& option = "--device");

// The registry platform of a device ("cpu" or "cuda").
const char* platform_of(Device device);

// Makes `device` usable: nothing for cpu; for cuda, checks that the binary has the CUDA backend
// and that a device exists (UsageError "--device cuda: no CUDA device (...)" / "--device cuda:
// this detlogp was built without CUDA ..." otherwise) and registers the cuda backend on
// Registry::global() once.
void init_device(Device device);

// The registry id of the canonical production backend on `device`.
std::string canonical_backend_id(Device device);

// A short description for reports: "cpu", or "cuda:0 (NVIDIA H200)".
std::string device_description(Device device);

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device device, std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;

  void* data() { return data_; }
  const void* data() const { return data_; }
  std::size_t size() const { return bytes_; }

  // Host -> buffer and buffer -> host, `bytes` from the start (at most size()).
  void upload(const void* host, std::size_t bytes);
  void download(void* host, std::size_t bytes) const;
  // Every byte set to `value` (like memset).
  void fill(int value);
  // `bytes` from the start of `src` (same device) into this buffer; returns when done.
  void copy_from(const DeviceBuffer& src, std::size_t bytes);

 private:
  void release() noexcept;
  Device device_ = Device::cpu;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace detlogp::cli
