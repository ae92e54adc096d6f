// CudaShardKernels (detlogp/cuda.hpp): argument checks (the same as every backend's), device
// pointer checks, then for each call one staged launch (staging.hpp) of its kernel (launch.hpp):
//
//   node_partials       nodes in; node_partials.cu; partials out
//   merge_roots         the root program and the partials in; roots.cu; LSE and entropy out
//   backward            per-row scalars and targets in; backward.cu; the gradient stays on the
//   device read_target_logits  targets in; read_targets.cu; target logits out
//
// Every call is synchronous and serialised by the object's lock (one staging area per object).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "detlogp/cuda.hpp"
#include "detlogp/errors.hpp"
#include "kernels/common/validate.hpp"
#include "kernels/cuda/cuda_error.hpp"
#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/staging.hpp"
#include "numerics/root_program.hpp"

namespace detlogp {
namespace cuda_impl {
namespace {

void require_device_pointer(const void* p, const char* kernel, const char* what) {
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess) {
    cudaGetLastError();  // reset the runtime's last-error state; the error is reported below
    throw_cuda(err, "cudaPointerGetAttributes");
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    throw ContractError(std::string("detlogp ") + kernel + ": " + what +
                        " is not CUDA device memory; CudaShardKernels reads and writes logits "
                        "on the device (use the CPU kernels for host buffers)");
  }
  int current = 0;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (attr.type == cudaMemoryTypeDevice && attr.device != current) {
    throw ContractError(std::string("detlogp ") + kernel + ": " + what + " lives on CUDA device " +
                        std::to_string(attr.device) + " but the current device is " +
                        std::to_string(current));
  }
}

// The CUDA kernels do not implement the logit softcap (their capability does not declare it);
// a spec with one is refused here too, never computed without the cap.
void refuse_softcap(const ShardSpec& spec, const char* kernel) {
  if (spec.softcap != 0.0f) {
    throw ContractError(ErrorCode::not_supported, "softcap",
                        std::string("detlogp ") + kernel +
                            ": the CUDA kernels have no logit "
                            "softcap (softcap=" +
                            std::to_string(spec.softcap) +
                            "); run a softcap contract on the CPU backends");
  }
}

// Nor per-row temperatures: refused, never computed with the scalar one.
void refuse_row_temperature(const ShardSpec& spec, const char* kernel) {
  if (!spec.row_temperature.empty()) {
    throw ContractError(ErrorCode::not_supported, "temperature",
                        std::string("detlogp ") + kernel +
                            ": the CUDA kernels have no per-row temperature; pass one scalar "
                            "temperature in the contract, or run on the CPU backends");
  }
}

int multiprocessor_count() {
  int device = 0;
  int sms = 1;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute");
  return sms;
}

}  // namespace
}  // namespace cuda_impl

using namespace cuda_impl;

struct CudaShardKernels::Impl {
  cudaStream_t stream = nullptr;
  mutable std::mutex mutex;
  mutable Staging staging;

  void launched(const char* what) const { check(cudaGetLastError(), what); }
  void sync() const { check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); }
};

CudaShardKernels::CudaShardKernels(void* stream) : impl_(std::make_unique<Impl>()) {
  impl_->stream = static_cast<cudaStream_t>(stream);
}

CudaShardKernels::~CudaShardKernels() = default;

std::string CudaShardKernels::name() const {
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "cuda";
  }
  return "cuda:sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
}

void CudaShardKernels::node_partials(const LogitsView& shard, const ShardSpec& spec,
                                     std::span<const TreeNode> nodes, bool with_entropy,
                                     std::span<NodePartial> out, const ExecOptions&) const {
  kernels::validate_node_partials(shard, spec, nodes, out);
  refuse_softcap(spec, "node_partials");
  refuse_row_temperature(spec, "node_partials");
  if (shard.rows == 0 || nodes.empty()) return;
  const bool any_data = shard.cols > 0;
  if (any_data) require_device_pointer(shard.data, "node_partials", "shard.data");
  std::lock_guard<std::mutex> lock(impl_->mutex);
  StagingLayout layout;
  const auto nodes_in = layout.input<TreeNode>(nodes.size());
  const auto partials_out = layout.output<NodePartial>(out.size());
  Staging& st = impl_->staging;
  st.prepare(layout);
  st.put(nodes_in, nodes);
  st.upload(layout, impl_->stream);
  launch_node_partials({.data = any_data ? shard.data : nullptr,
                        .dtype = shard.dtype,
                        .row_stride = shard.row_stride,
                        .rows = shard.rows,
                        .vocab_start = spec.vocab_start,
                        .real_vocab = spec.geometry.real_vocab,
                        .tile_width = spec.geometry.tile_width,
                        .temperature = spec.temperature,
                        .with_entropy = with_entropy,
                        .nodes = st.device(nodes_in),
                        .num_nodes = static_cast<int64_t>(nodes.size()),
                        .out = st.device(partials_out)},
                       multiprocessor_count(), impl_->stream);
  impl_->launched("node_partials_kernel launch");
  const std::span<const NodePartial> partials = st.download(partials_out, impl_->stream);
  std::copy(partials.begin(), partials.end(), out.begin());
}

void CudaShardKernels::merge_roots(const TileGeometry& geometry, std::span<const TreeNode> nodes,
                                   std::span<const NodePartial> partials, int64_t rows,
                                   RootsOut roots, const ExecOptions&) const {
  kernels::validate_merge_roots(geometry, nodes, partials, rows, roots);
  if (rows == 0) return;
  const numerics::RootProgram program(geometry, nodes);
  const bool with_entropy = !roots.entropy.empty();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  StagingLayout layout;
  const auto ops_in = layout.input<int32_t>(program.ops().size());
  const auto partials_in = layout.input<NodePartial>(partials.size());
  const auto roots_out = layout.output<float>(static_cast<size_t>(rows) * 2);  // LSE, entropy
  Staging& st = impl_->staging;
  st.prepare(layout);
  st.put(ops_in, program.ops());
  st.put(partials_in, partials);
  st.upload(layout, impl_->stream);
  float* d_roots = st.device(roots_out);
  launch_merge_roots({.ops = st.device(ops_in),
                      .num_ops = static_cast<int64_t>(program.ops().size()),
                      .partials = st.device(partials_in),
                      .num_nodes = static_cast<int64_t>(nodes.size()),
                      .rows = rows,
                      .with_entropy = with_entropy,
                      .lse = d_roots,
                      .entropy = d_roots + rows},
                     impl_->stream);
  impl_->launched("merge_roots_kernel launch");
  const std::span<const float> values = st.download(roots_out, impl_->stream);
  std::copy(values.begin(), values.begin() + rows, roots.lse.begin());
  if (with_entropy) std::copy(values.begin() + rows, values.end(), roots.entropy.begin());
}

void CudaShardKernels::backward(const LogitsView& shard, const ShardSpec& spec,
                                const BackwardInputs& in, const MutableLogitsView& grad,
                                const ExecOptions&) const {
  kernels::validate_backward(shard, spec, in, grad);
  refuse_softcap(spec, "backward");
  refuse_row_temperature(spec, "backward");
  if (shard.rows == 0 || shard.cols == 0) return;
  require_device_pointer(shard.data, "backward", "shard.data");
  require_device_pointer(grad.data, "backward", "grad.data");
  const auto rows = static_cast<size_t>(shard.rows);
  const bool has_entropy = !in.grad_entropy.empty();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  // Per-row inputs; those not supplied are never read.
  StagingLayout layout;
  const auto lse_in = layout.input<float>(rows);
  const auto entropy_in = layout.input<float>(rows);
  const auto grad_logp_in = layout.input<float>(rows);
  const auto grad_lse_in = layout.input<float>(rows);
  const auto grad_entropy_in = layout.input<float>(rows);
  const auto target_in = layout.input<int64_t>(rows);
  Staging& st = impl_->staging;
  st.prepare(layout);
  st.put(lse_in, in.lse);
  if (has_entropy) st.put(entropy_in, in.entropy);
  st.put(grad_logp_in, in.grad_logp);
  st.put(grad_lse_in, in.grad_lse);
  st.put(grad_entropy_in, in.grad_entropy);
  st.put(target_in, in.target_local);
  st.upload(layout, impl_->stream);
  launch_backward(
      {.data = shard.data,
       .dtype = shard.dtype,
       .row_stride = shard.row_stride,
       .grad = grad.data,
       .grad_row_stride = grad.row_stride,
       .rows = shard.rows,
       .cols = shard.cols,
       .real_cols = std::clamp<int64_t>(spec.geometry.real_vocab - spec.vocab_start, 0, shard.cols),
       .temperature = spec.temperature,
       .has_logp = !in.grad_logp.empty(),
       .has_lse = !in.grad_lse.empty(),
       .has_entropy = has_entropy,
       .lse = st.device(lse_in),
       .entropy = st.device(entropy_in),
       .grad_logp = st.device(grad_logp_in),
       .grad_lse = st.device(grad_lse_in),
       .grad_entropy = st.device(grad_entropy_in),
       .target = st.device(target_in)},
      impl_->stream);
  impl_->launched("backward_kernel launch");
  impl_->sync();
}

void CudaShardKernels::read_target_logits(const LogitsView& shard, const ShardSpec& spec,
                                          std::span<const int64_t> target_local,
                                          std::span<float> out) const {
  const char* kernel = "read_target_logits";
  kernels::validate_shard(shard, spec, kernel);
  kernels::validate_targets(shard, spec, target_local, kernel);
  refuse_softcap(spec, kernel);
  refuse_row_temperature(spec, kernel);
  if (static_cast<int64_t>(out.size()) != shard.rows) {
    throw ContractError("detlogp read_target_logits: out has " + std::to_string(out.size()) +
                        " entries, expected rows = " + std::to_string(shard.rows));
  }
  if (shard.rows == 0) return;
  if (std::none_of(target_local.begin(), target_local.end(), [](int64_t t) { return t >= 0; })) {
    std::fill(out.begin(), out.end(), 0.0f);
    return;
  }
  require_device_pointer(shard.data, kernel, "shard.data");
  std::lock_guard<std::mutex> lock(impl_->mutex);
  StagingLayout layout;
  const auto target_in = layout.input<int64_t>(target_local.size());
  const auto z_out = layout.output<float>(out.size());
  Staging& st = impl_->staging;
  st.prepare(layout);
  st.put(target_in, target_local);
  st.upload(layout, impl_->stream);
  launch_read_targets({.data = shard.data,
                       .dtype = shard.dtype,
                       .row_stride = shard.row_stride,
                       .rows = shard.rows,
                       .target = st.device(target_in),
                       .temperature = spec.temperature,
                       .out = st.device(z_out)},
                      impl_->stream);
  impl_->launched("read_targets_kernel launch");
  const std::span<const float> z = st.download(z_out, impl_->stream);
  std::copy(z.begin(), z.end(), out.begin());
}

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount: 0 devices";
  return n;
}

const ShardKernels& cuda_kernels() {
  static const CudaShardKernels kernels;
  return kernels;
}

}  // namespace detlogp
