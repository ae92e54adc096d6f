#pragma once
// The one staging recipe of every CudaShardKernels call: the call's host inputs (nodes, root
// programs, per-row scalars, ...) and its outputs live in one grow-only device buffer mirrored by
// a pinned host buffer. A call lays out its pieces (inputs first, each 256-byte aligned), fills
// the inputs on the host, uploads them in one copy, launches, and downloads its outputs in one
// copy and a stream synchronisation. Not thread-safe: the caller holds its kernels' lock.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <span>

namespace detlogp::cuda_impl {

template <class T>
struct Piece {
  size_t offset;  // bytes from the start of the buffers
  size_t count;   // elements
};

class StagingLayout {
 public:
  template <class T>
  Piece<T> input(size_t count) {
    if (outputs_) throw_order();
    return add<T>(count);
  }
  template <class T>
  Piece<T> output(size_t count) {
    if (!outputs_) inputs_end_ = end_;
    outputs_ = true;
    return add<T>(count);
  }
  size_t inputs_end() const { return outputs_ ? inputs_end_ : end_; }
  size_t end() const { return end_; }

 private:
  template <class T>
  Piece<T> add(size_t count) {
    const Piece<T> p{end_, count};
    end_ += (count * sizeof(T) + 255) / 256 * 256;
    return p;
  }
  [[noreturn]] static void throw_order();

  size_t end_ = 0;
  size_t inputs_end_ = 0;
  bool outputs_ = false;
};

class Staging {
 public:
  Staging() = default;
  ~Staging();
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // Grows the buffers to hold `layout` (their contents are not kept).
  void prepare(const StagingLayout& layout);

  template <class T>
  T* host(Piece<T> p) const {
    return reinterpret_cast<T*>(host_ + p.offset);
  }
  template <class T>
  T* device(Piece<T> p) const {
    return reinterpret_cast<T*>(device_ + p.offset);
  }
  template <class T>
  void put(Piece<T> p, std::span<const T> values) const {
    std::copy(values.begin(), values.end(), host(p));
  }

  // Copies every input piece of `layout` to the device (asynchronously, on `stream`).
  void upload(const StagingLayout& layout, cudaStream_t stream) const;
  // Copies piece `p` back, waits for the stream, and returns the host copy.
  template <class T>
  std::span<const T> download(Piece<T> p, cudaStream_t stream) const {
    download_bytes(p.offset, p.count * sizeof(T), stream);
    return {host(p), p.count};
  }

 private:
  void download_bytes(size_t offset, size_t bytes, cudaStream_t stream) const;

  char* device_ = nullptr;
  size_t device_size_ = 0;
  char* host_ = nullptr;
  size_t host_size_ = 0;
};

}  // namespace detlogp::cuda_impl
