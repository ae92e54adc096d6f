#pragma once
// The CUDA backend of the numerics canon (docs/cuda.md): shard kernels whose outputs equal the
// CPU kernels' bit for bit. The "cuda" platform backend of the registry is declared in
// detlogp/cuda_registry.hpp.
//
// Library target detlogp::cuda (built only when a CUDA compiler is found; the core library
// never needs CUDA). The CUDA runtime is linked statically: a binary needs only the driver.
//
//   detlogp::CudaShardKernels kernels;                       // current device, default stream
//   kernels.node_partials(device_view, spec, nodes, true, host_out);
//
// Memory: every LogitsView / MutableLogitsView handed to CudaShardKernels points to DEVICE
// memory of the current CUDA device (cudaMalloc, a torch CUDA tensor, ...); a host pointer is
// rejected with ContractError. Everything else (nodes, node partials, LSE, entropy, targets,
// incoming gradients, read target logits) is ordinary HOST memory: a few floats per row, staged
// through pinned host buffers. Every call is synchronous: it returns once its work on the
// kernels' stream is done (host outputs written, device gradient complete).

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "detlogp/kernels.hpp"

namespace detlogp {

// Number of CUDA devices this process can use; 0 when there is none or no usable driver, with
// the reason in *why (e.g. "cudaGetDeviceCount: no CUDA-capable device is detected").
int cuda_device_count(std::string* why = nullptr);

class CudaShardKernels final : public ShardKernels {
 public:
  // `stream`: a cudaStream_t (as void*, so that this header needs no CUDA headers); null is the
  // legacy default stream. Work runs on the device current at each call.
  explicit CudaShardKernels(void* stream = nullptr);
  ~CudaShardKernels() override;
  CudaShardKernels(const CudaShardKernels&) = delete;
  CudaShardKernels& operator=(const CudaShardKernels&) = delete;

  // "cuda:sm_<major><minor>" of the current device ("cuda" when there is none).
  std::string name() const override;

  void node_partials(const LogitsView& shard, const ShardSpec& spec,
                     std::span<const TreeNode> nodes, bool with_entropy, std::span<NodePartial> out,
                     const ExecOptions& exec = {}) const override;

  // Partials and roots are host memory; the root of each row is rebuilt on the device.
  void merge_roots(const TileGeometry& geometry, std::span<const TreeNode> nodes,
                   std::span<const NodePartial> partials, int64_t rows, RootsOut roots,
                   const ExecOptions& exec = {}) const override;

  // shard and grad: device memory. in: host memory.
  void backward(const LogitsView& shard, const ShardSpec& spec, const BackwardInputs& in,
                const MutableLogitsView& grad, const ExecOptions& exec = {}) const override;

  // shard: device memory; target_local and out: host memory.
  void read_target_logits(const LogitsView& shard, const ShardSpec& spec,
                          std::span<const int64_t> target_local,
                          std::span<float> out) const override;

  // Kept sets are not implemented on the device (the capability says so).
  bool supports_kept_sets() const override { return false; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A process-wide CudaShardKernels on the legacy default stream (built on first use).
const ShardKernels& cuda_kernels();

}  // namespace detlogp
