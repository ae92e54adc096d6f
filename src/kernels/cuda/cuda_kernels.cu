// CUDA kernels of the numerics canon (shared/design/numerics.md, docs/cuda.md). Every
// floating-point operation is a call into numerics/canon.hpp, compiled for the device from the
// same header the CPU reference uses; this file only decides which values go in, in which order,
// and that order is the canon's:
//
//   leaf(t)        one 32-lane warp per (row, tile): lane j holds the tile's elements
//                  k = j, j+32, j+64, ... in increasing k, sums det_exp(z_k - m) from +0 in that
//                  order, then the lanes fold with __shfl_down_sync for h = 16, 8, 4, 2, 1
//                  (lane j += lane j+h): literally canon::leaf_partial's lane order.
//   node           one block per row: leaves of aligned chunks of 32 tiles per warp, each chunk
//                  reduced pairwise (merge(2i, 2i+1)) level by level with shuffles, then the
//                  warps' chunk roots likewise in warp 0, then chunk roots of a larger node
//                  combined by a binary counter (merge(older, newer) whenever two equal levels
//                  meet): every internal node is canon::merge(left child, right child).
//   root           one thread per row evaluates the tree above the given nodes in post-order.
//   backward       canon::grad_element per real column, +0 on padding, narrowed by
//                  canon::float_to_bf16 / float_to_fp16 / canonicalize.
//
// The leaf's per-element exp is det_exp_shift (exp_shift.hpp): canon::det_exp's bits without its
// two float->int conversions, proven equal for every fp32 input by an exhaustive CPU test.
//
// Built with -fmad=false -ftz=false -prec-div=true (no contraction, no fast math); fma only
// through canon::fma_rn (__fmaf_rn). No atomics: each output is written by one thread.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "detlogp/cuda.hpp"
#include "detlogp/errors.hpp"
#include "kernels/common/validate.hpp"
#include "kernels/cuda/exp_shift.hpp"
#include "numerics/canon.hpp"

namespace detlogp {
namespace cuda_impl {

// ---------------------------------------------------------------------------------------------
// Errors.

[[noreturn]] void throw_cuda(cudaError_t err, const char* what) {
  throw std::runtime_error(std::string("detlogp cuda: ") + what + ": " + cudaGetErrorName(err) +
                           " (" + cudaGetErrorString(err) + ")");
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw_cuda(err, what);
}

// ---------------------------------------------------------------------------------------------
// Element access on the device. kDtype is DType as an int: 0 bf16, 1 fp16, 2 fp32.

constexpr int kBf16 = static_cast<int>(DType::bf16);
constexpr int kFp16 = static_cast<int>(DType::fp16);
constexpr int kFp32 = static_cast<int>(DType::fp32);

template <int kDtype>
__device__ __forceinline__ float load_x(const void* __restrict__ base, int64_t index) {
  if constexpr (kDtype == kFp32) {
    return static_cast<const float*>(base)[index];
  } else {
    const uint16_t h = static_cast<const uint16_t*>(base)[index];
    return kDtype == kBf16 ? canon::bf16_to_float(h) : canon::fp16_to_float(h);
  }
}

template <int kDtype>
__device__ __forceinline__ void store_x(void* __restrict__ base, int64_t index, float value) {
  if constexpr (kDtype == kFp32) {
    static_cast<float*>(base)[index] = canon::canonicalize(value);
  } else {
    static_cast<uint16_t*>(base)[index] =
        kDtype == kBf16 ? canon::float_to_bf16(value) : canon::float_to_fp16(value);
  }
}

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarp = 32;
constexpr int kWarps = 8;  // warps per block of the node kernel
constexpr int kBlock = kWarps * kWarp;
constexpr int kTilesPerWarp = 32;  // one aligned chunk of leaves per warp
constexpr int kChunkLevel = 8;     // a block step covers 2^8 = kWarps * kTilesPerWarp tiles
static_assert((1 << kChunkLevel) == kWarps * kTilesPerWarp, "chunk = one aligned block step");
constexpr int kSmallPerLane = 4;  // W <= 128: the tile stays in registers
constexpr int kMaxStack = 64;

static_assert(canon::kLanes == kWarp, "the canon's lane order is a 32-lane warp");

__device__ __forceinline__ canon::Partial shfl_partial(const canon::Partial& p, int src) {
  return canon::Partial{__shfl_sync(kFullMask, p.m, src), __shfl_sync(kFullMask, p.s, src),
                        __shfl_sync(kFullMask, p.u, src)};
}

// The lane fold of numerics.md "Leaf partial" step 3: lane[j] = lane[j] + lane[j + h] for
// h = 16..1; lane 0 holds the sum (other lanes hold values the canon never reads).
__device__ __forceinline__ float fold_lanes(float v) {
#pragma unroll
  for (int h = kWarp / 2; h >= 1; h /= 2) v = v + __shfl_down_sync(kFullMask, v, h);
  return v;
}

// Maximum over the warp; exact in any order (the sign of a zero result is normalised later).
__device__ __forceinline__ float warp_max(float m) {
#pragma unroll
  for (int h = kWarp / 2; h >= 1; h /= 2) {
    const float o = __shfl_xor_sync(kFullMask, m, h);
    m = o > m ? o : m;
  }
  return m;
}

// canon::leaf_partial for one tile by one warp, from z values this lane holds: z[i] is element
// k = lane + 32 i of the tile (valid when k < count). Returns the partial in every lane.
template <bool kEntropy, int kPerLane>
__device__ __forceinline__ canon::Partial leaf_from_registers(const float (&z)[kPerLane], int count,
                                                              int lane) {
  float m = -canon::kInf;
  bool saw_nan = false;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (lane + kWarp * i < count) {
      saw_nan = saw_nan || canon::is_nan(z[i]);
      m = z[i] > m ? z[i] : m;
    }
  }
  saw_nan = __any_sync(kFullMask, saw_nan);
  m = warp_max(m);
  if (saw_nan || m == canon::kInf) return canon::poisoned_partial();
  if (m == -canon::kInf) return canon::identity_partial();
  if (m == 0.0f) m = 0.0f;  // normalise -0 to +0
  float s = 0.0f;
  float u = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (lane + kWarp * i < count) {
      const float e = det_exp_shift(z[i] - m);  // == canon::det_exp, bit for bit
      s = s + e;
      if (kEntropy) u = u + canon::entropy_term(e, z[i], m);
    }
  }
  s = fold_lanes(s);
  if (kEntropy) u = fold_lanes(u);
  return canon::Partial{m, __shfl_sync(kFullMask, s, 0),
                        kEntropy ? __shfl_sync(kFullMask, u, 0) : 0.0f};
}

// The same for a tile of any width, reading z twice (max, then sums) from memory.
template <int kDtype, bool kEntropy>
__device__ canon::Partial leaf_any_width(const void* __restrict__ row, int64_t local_begin,
                                         int64_t count, float tau, int lane) {
  float m = -canon::kInf;
  bool saw_nan = false;
  for (int64_t k = lane; k < count; k += kWarp) {
    const float z = canon::scale_logit(load_x<kDtype>(row, local_begin + k), tau);
    saw_nan = saw_nan || canon::is_nan(z);
    m = z > m ? z : m;
  }
  saw_nan = __any_sync(kFullMask, saw_nan);
  m = warp_max(m);
  if (saw_nan || m == canon::kInf) return canon::poisoned_partial();
  if (m == -canon::kInf) return canon::identity_partial();
  if (m == 0.0f) m = 0.0f;
  float s = 0.0f;
  float u = 0.0f;
  for (int64_t k = lane; k < count; k += kWarp) {
    const float z = canon::scale_logit(load_x<kDtype>(row, local_begin + k), tau);
    const float e = det_exp_shift(z - m);  // == canon::det_exp, bit for bit
    s = s + e;
    if (kEntropy) u = u + canon::entropy_term(e, z, m);
  }
  s = fold_lanes(s);
  if (kEntropy) u = fold_lanes(u);
  return canon::Partial{m, __shfl_sync(kFullMask, s, 0),
                        kEntropy ? __shfl_sync(kFullMask, u, 0) : 0.0f};
}

// Pairwise tree over the partials held by lanes 0..n-1 (n a power of two <= 32): level by level,
// lane i <- merge(lane 2i, lane 2i+1). Lane 0 ends with the root of the n partials.
template <bool kEntropy>
__device__ __forceinline__ canon::Partial warp_tree(canon::Partial mine, int n, int lane) {
  for (int h = n / 2; h >= 1; h /= 2) {
    const canon::Partial left = shfl_partial(mine, (2 * lane) & (kWarp - 1));
    const canon::Partial right = shfl_partial(mine, (2 * lane + 1) & (kWarp - 1));
    if (lane < h) mine = canon::merge<kEntropy>(left, right);
  }
  return mine;
}

struct NodeJob {
  const void* data;  // device: element (r, c) at data + (r * row_stride + c) * dtype size
  int64_t row_stride;
  int64_t rows;
  int64_t vocab_start;
  int64_t real_vocab;
  int64_t tile_width;
  float temperature;
  const int64_t* nodes;  // device: [num_nodes][2] = (level, index)
  int64_t num_nodes;
  float* out;  // device: [rows][num_nodes][3] = (m, s, u)
};

// z of the tile's element held by this lane (raw load; scaled in the caller).
template <int kDtype>
__device__ __forceinline__ void load_tile_registers(const void* __restrict__ row,
                                                    int64_t local_begin, int count, int lane,
                                                    float (&x)[kSmallPerLane]) {
#pragma unroll
  for (int i = 0; i < kSmallPerLane; ++i) {
    const int k = lane + kWarp * i;
    x[i] = k < count ? load_x<kDtype>(row, local_begin + k) : 0.0f;
  }
}

// Node partials: one block (kBlock threads) per row at a time. kSmall: W <= 128.
template <int kDtype, bool kEntropy, bool kSmall>
__global__ void __launch_bounds__(kBlock) node_partials_kernel(NodeJob job) {
  __shared__ canon::Partial warp_roots[2][kWarps];
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int64_t w = job.tile_width;
  const int64_t real_tiles = (job.real_vocab + w - 1) / w;
  const size_t esize = kDtype == kFp32 ? 4 : 2;
  // Binary counter of chunk roots (touched by thread 0 only): stack[i] has level stack_level[i].
  __shared__ canon::Partial stack[kMaxStack];
  __shared__ int stack_level[kMaxStack];
  int parity = 0;

  for (int64_t r = blockIdx.x; r < job.rows; r += gridDim.x) {
    const void* row =
        static_cast<const char*>(job.data) + static_cast<size_t>(r * job.row_stride) * esize;
    for (int64_t j = 0; j < job.num_nodes; ++j) {
      const int level = static_cast<int>(job.nodes[2 * j]);
      const int64_t first = job.nodes[2 * j + 1] << level;
      const int64_t n_tiles = int64_t{1} << level;
      const int chunk_level = level < kChunkLevel ? level : kChunkLevel;
      const int64_t chunk_tiles = int64_t{1} << chunk_level;
      // Tiles per warp in a chunk, and warps that hold some.
      const int per_warp =
          static_cast<int>(chunk_tiles < kTilesPerWarp ? chunk_tiles : kTilesPerWarp);
      const int busy_warps = static_cast<int>(chunk_tiles / per_warp);
      int stack_size = 0;
      for (int64_t chunk = first; chunk < first + n_tiles; chunk += chunk_tiles) {
        canon::Partial chunk_root = canon::identity_partial();
        if (chunk < real_tiles) {  // else: only padding tiles, an identity (uniform branch)
          // 1. Each busy warp: leaves of tiles [t0, t0 + per_warp), lane i keeps tile t0 + i.
          if (warp < busy_warps) {
            const int64_t t0 = chunk + static_cast<int64_t>(warp) * per_warp;
            canon::Partial mine = canon::identity_partial();
            if constexpr (kSmall) {
              float x[kSmallPerLane];
              auto tile_count = [&](int64_t t) -> int {
                const int64_t b = t * w;
                const int64_t e = b + w < job.real_vocab ? b + w : job.real_vocab;
                return e > b ? static_cast<int>(e - b) : 0;
              };
              int count = t0 < real_tiles ? tile_count(t0) : 0;
              if (count > 0)
                load_tile_registers<kDtype>(row, t0 * w - job.vocab_start, count, lane, x);
              for (int i = 0; i < per_warp; ++i) {
                // Prefetch the next tile while this one is reduced.
                float next[kSmallPerLane];
                const int64_t tn = t0 + i + 1;
                const int next_count = (i + 1 < per_warp && tn < real_tiles) ? tile_count(tn) : 0;
                if (next_count > 0)
                  load_tile_registers<kDtype>(row, tn * w - job.vocab_start, next_count, lane,
                                              next);
                canon::Partial leaf = canon::identity_partial();
                if (count > 0) {
                  float z[kSmallPerLane];
#pragma unroll
                  for (int q = 0; q < kSmallPerLane; ++q)
                    z[q] = canon::scale_logit(x[q], job.temperature);
                  leaf = leaf_from_registers<kEntropy, kSmallPerLane>(z, count, lane);
                }
                if (lane == i) mine = leaf;
#pragma unroll
                for (int q = 0; q < kSmallPerLane; ++q) x[q] = next[q];
                count = next_count;
              }
            } else {
              for (int i = 0; i < per_warp; ++i) {
                const int64_t t = t0 + i;
                canon::Partial leaf = canon::identity_partial();
                if (t < real_tiles) {
                  const int64_t b = t * w;
                  const int64_t e = b + w < job.real_vocab ? b + w : job.real_vocab;
                  leaf = leaf_any_width<kDtype, kEntropy>(row, b - job.vocab_start, e - b,
                                                          job.temperature, lane);
                }
                if (lane == i) mine = leaf;
              }
            }
            mine = warp_tree<kEntropy>(mine, per_warp, lane);
            if (lane == 0) warp_roots[parity][warp] = mine;
          }
          __syncthreads();
          // 2. Warp 0: the tree over the busy warps' roots (in tile order).
          if (warp == 0) {
            canon::Partial mine =
                lane < busy_warps ? warp_roots[parity][lane] : canon::identity_partial();
            chunk_root = warp_tree<kEntropy>(mine, busy_warps, lane);
          }
          parity ^= 1;  // the next chunk writes the other buffer (no second barrier needed)
        }
        // 3. Thread 0: binary counter over the node's chunks, left to right.
        if (threadIdx.x == 0) {
          stack[stack_size] = chunk_root;
          stack_level[stack_size] = chunk_level;
          ++stack_size;
          while (stack_size >= 2 && stack_level[stack_size - 1] == stack_level[stack_size - 2]) {
            stack[stack_size - 2] =
                canon::merge<kEntropy>(stack[stack_size - 2], stack[stack_size - 1]);
            ++stack_level[stack_size - 2];
            --stack_size;
          }
        }
      }
      if (threadIdx.x == 0) {
        float* o = job.out + (r * job.num_nodes + j) * 3;
        o[0] = stack[0].m;
        o[1] = stack[0].s;
        o[2] = stack[0].u;
      }
    }
  }
}

// Roots: one thread per row evaluates the post-order program `ops` (op >= 0: push the given
// node partial of that slot; -1: push the identity; -2: pop right, pop left, push merge).
template <bool kEntropy>
__global__ void merge_roots_kernel(const int32_t* __restrict__ ops, int num_ops,
                                   const float* __restrict__ partials, int64_t num_nodes,
                                   int64_t rows, float* __restrict__ lse,
                                   float* __restrict__ entropy) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  canon::Partial stack[kMaxStack];
  int top = 0;
  const float* row = partials + r * num_nodes * 3;
  for (int i = 0; i < num_ops; ++i) {
    const int32_t op = ops[i];
    if (op >= 0) {
      stack[top++] = canon::Partial{row[3 * op], row[3 * op + 1], row[3 * op + 2]};
    } else if (op == -1) {
      stack[top++] = canon::identity_partial();
    } else {
      stack[top - 2] = canon::merge<kEntropy>(stack[top - 2], stack[top - 1]);
      --top;
    }
  }
  const canon::RootValues v = canon::finish_root(stack[0]);
  lse[r] = v.lse;
  if (kEntropy) entropy[r] = v.entropy;
}

struct BackwardJob {
  const void* data;
  int64_t row_stride;
  void* grad;
  int64_t grad_row_stride;
  int64_t rows;
  int64_t cols;
  int64_t real_cols;  // local columns [0, real_cols) are real: min(cols, R - vocab_start)
  float temperature;
  bool has_logp, has_lse, has_entropy;
  const float* lse;  // device, [rows] each (null when not supplied)
  const float* entropy;
  const float* grad_logp;
  const float* grad_lse;
  const float* grad_entropy;
  const int64_t* target;
};

// Backward: each thread writes kVec consecutive columns of one row (16-byte accesses when
// kAligned). Grid: x over column groups, y over rows (strided).
template <int kDtype, bool kAligned>
__global__ void __launch_bounds__(256) backward_kernel(BackwardJob job) {
  constexpr int kVec = kDtype == kFp32 ? 4 : 8;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (c0 >= job.cols) return;
  for (int64_t r = blockIdx.y; r < job.rows; r += gridDim.y) {
    canon::GradCoefficients g{};
    g.has_logp = job.has_logp;
    g.has_lse = job.has_lse;
    g.has_entropy = job.has_entropy;
    g.g_logp = job.has_logp ? job.grad_logp[r] : 0.0f;
    g.g_lse = job.has_lse ? job.grad_lse[r] : 0.0f;
    g.g_entropy = job.has_entropy ? job.grad_entropy[r] : 0.0f;
    const float lse = job.lse[r];
    const float ent = job.has_entropy ? job.entropy[r] : 0.0f;
    const int64_t target = job.target[r];
    const int64_t in_base = r * job.row_stride;
    const int64_t out_base = r * job.grad_row_stride;
    if (kAligned && c0 + kVec <= job.cols) {
      // 16-byte load and store.
      const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const char*>(job.data) +
                                                        (in_base + c0) * (kDtype == kFp32 ? 4 : 2));
      uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
      uint32_t out_words[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if constexpr (kDtype == kFp32) {
          const int64_t c = c0 + q;
          float v = 0.0f;
          if (c < job.real_cols) {
            const float z = canon::scale_logit(canon::float_of(words[q]), job.temperature);
            v = canon::grad_element(z, c == target, lse, ent, g, job.temperature);
          }
          out_words[q] = canon::bits_of(canon::canonicalize(v));
        } else {
          uint32_t packed = 0;
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int64_t c = c0 + 2 * q + half;
            const uint16_t h = static_cast<uint16_t>(words[q] >> (16 * half));
            float v = 0.0f;
            if (c < job.real_cols) {
              const float x = kDtype == kBf16 ? canon::bf16_to_float(h) : canon::fp16_to_float(h);
              const float z = canon::scale_logit(x, job.temperature);
              v = canon::grad_element(z, c == target, lse, ent, g, job.temperature);
            }
            const uint16_t o = kDtype == kBf16 ? canon::float_to_bf16(v) : canon::float_to_fp16(v);
            packed |= static_cast<uint32_t>(o) << (16 * half);
          }
          out_words[q] = packed;
        }
      }
      *reinterpret_cast<uint4*>(static_cast<char*>(job.grad) +
                                (out_base + c0) * (kDtype == kFp32 ? 4 : 2)) =
          make_uint4(out_words[0], out_words[1], out_words[2], out_words[3]);
    } else {
      for (int q = 0; q < kVec; ++q) {
        const int64_t c = c0 + q;
        if (c >= job.cols) break;
        float v = 0.0f;
        if (c < job.real_cols) {
          const float z =
              canon::scale_logit(load_x<kDtype>(job.data, in_base + c), job.temperature);
          v = canon::grad_element(z, c == target, lse, ent, g, job.temperature);
        }
        store_x<kDtype>(job.grad, out_base + c, v);
      }
    }
  }
}

template <int kDtype>
__global__ void read_targets_kernel(const void* __restrict__ data, int64_t row_stride, int64_t rows,
                                    const int64_t* __restrict__ target, float tau,
                                    float* __restrict__ out) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int64_t t = target[r];
  out[r] =
      t < 0
          ? 0.0f
          : canon::canonicalize(canon::scale_logit(load_x<kDtype>(data, r * row_stride + t), tau));
}

// ---------------------------------------------------------------------------------------------
// Host side: scratch buffers, dispatch over dtypes.

size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

// A grow-only pair of buffers (device and pinned host), carved into aligned pieces per call.
class Scratch {
 public:
  ~Scratch() {
    if (device_) cudaFree(device_);
    if (host_) cudaFreeHost(host_);
  }
  void reserve(size_t device_bytes, size_t host_bytes) {
    if (device_bytes > device_size_) {
      if (device_) check(cudaFree(device_), "cudaFree");
      device_ = nullptr;
      device_size_ = 0;
      check(cudaMalloc(&device_, device_bytes), "cudaMalloc (scratch)");
      device_size_ = device_bytes;
    }
    if (host_bytes > host_size_) {
      if (host_) check(cudaFreeHost(host_), "cudaFreeHost");
      host_ = nullptr;
      host_size_ = 0;
      check(cudaMallocHost(&host_, host_bytes), "cudaMallocHost (pinned staging)");
      host_size_ = host_bytes;
    }
  }
  char* device() const { return static_cast<char*>(device_); }
  char* host() const { return static_cast<char*>(host_); }

 private:
  void* device_ = nullptr;
  size_t device_size_ = 0;
  void* host_ = nullptr;
  size_t host_size_ = 0;
};

template <class Fn>
void dispatch_dtype(DType d, const Fn& fn) {
  switch (d) {
    case DType::bf16:
      fn(std::integral_constant<int, kBf16>{});
      return;
    case DType::fp16:
      fn(std::integral_constant<int, kFp16>{});
      return;
    case DType::fp32:
      fn(std::integral_constant<int, kFp32>{});
      return;
  }
  throw std::logic_error("detlogp cuda: unknown dtype");
}

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

// The post-order program of merge_roots_kernel for the tree above `nodes`.
void build_root_program(const TileGeometry& geometry, std::span<const TreeNode> nodes, int level,
                        int64_t index, std::vector<int32_t>& ops, int depth, int& max_depth) {
  max_depth = std::max(max_depth, depth + 1);
  for (size_t j = 0; j < nodes.size(); ++j) {
    if (nodes[j].level == level && nodes[j].index == index) {
      ops.push_back(static_cast<int32_t>(j));
      return;
    }
  }
  if ((index << level) >= geometry.num_real_tiles()) {
    ops.push_back(-1);
    return;
  }
  if (level == 0) throw std::logic_error("merge_roots: the nodes do not cover the real tiles");
  build_root_program(geometry, nodes, level - 1, 2 * index, ops, depth, max_depth);
  build_root_program(geometry, nodes, level - 1, 2 * index + 1, ops, depth + 1, max_depth);
  ops.push_back(-2);
}

}  // namespace cuda_impl

using namespace cuda_impl;

struct CudaShardKernels::Impl {
  cudaStream_t stream = nullptr;
  mutable std::mutex mutex;
  mutable Scratch scratch;

  void sync() const { check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); }
  void launched(const char* what) const { check(cudaGetLastError(), what); }
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
  if (shard.rows == 0 || nodes.empty()) return;
  const bool any_data = shard.cols > 0;
  if (any_data) require_device_pointer(shard.data, "node_partials", "shard.data");
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const size_t node_bytes = align_up(nodes.size() * 2 * sizeof(int64_t));
  const size_t out_bytes = align_up(out.size() * 3 * sizeof(float));
  impl_->scratch.reserve(node_bytes + out_bytes, node_bytes + out_bytes);
  char* dev = impl_->scratch.device();
  char* host = impl_->scratch.host();
  auto* host_nodes = reinterpret_cast<int64_t*>(host);
  for (size_t j = 0; j < nodes.size(); ++j) {
    host_nodes[2 * j] = nodes[j].level;
    host_nodes[2 * j + 1] = nodes[j].index;
  }
  check(cudaMemcpyAsync(dev, host, nodes.size() * 2 * sizeof(int64_t), cudaMemcpyHostToDevice,
                        impl_->stream),
        "cudaMemcpyAsync (nodes)");
  NodeJob job{};
  job.data = any_data ? shard.data : nullptr;
  job.row_stride = shard.row_stride;
  job.rows = shard.rows;
  job.vocab_start = spec.vocab_start;
  job.real_vocab = spec.geometry.real_vocab;
  job.tile_width = spec.geometry.tile_width;
  job.temperature = spec.temperature;
  job.nodes = reinterpret_cast<const int64_t*>(dev);
  job.num_nodes = static_cast<int64_t>(nodes.size());
  job.out = reinterpret_cast<float*>(dev + node_bytes);
  int device = 0;
  int sms = 1;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute");
  const int64_t blocks = std::min<int64_t>(shard.rows, int64_t{sms} * 16);
  const bool small = spec.geometry.tile_width <= kWarp * kSmallPerLane;
  dispatch_dtype(shard.dtype, [&](auto dt) {
    constexpr int D = decltype(dt)::value;
    auto launch = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(blocks), kBlock, 0, impl_->stream>>>(job);
    };
    if (with_entropy) {
      small ? launch(node_partials_kernel<D, true, true>)
            : launch(node_partials_kernel<D, true, false>);
    } else {
      small ? launch(node_partials_kernel<D, false, true>)
            : launch(node_partials_kernel<D, false, false>);
    }
  });
  impl_->launched("node_partials_kernel launch");
  check(cudaMemcpyAsync(host + node_bytes, dev + node_bytes, out.size() * 3 * sizeof(float),
                        cudaMemcpyDeviceToHost, impl_->stream),
        "cudaMemcpyAsync (node partials)");
  impl_->sync();
  const auto* partials = reinterpret_cast<const float*>(host + node_bytes);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = NodePartial{partials[3 * i], partials[3 * i + 1], partials[3 * i + 2]};
  }
}

void CudaShardKernels::merge_roots(const TileGeometry& geometry, std::span<const TreeNode> nodes,
                                   std::span<const NodePartial> partials, int64_t rows,
                                   RootsOut roots, const ExecOptions&) const {
  kernels::validate_merge_roots(geometry, nodes, partials, rows, roots);
  if (rows == 0) return;
  std::vector<int32_t> ops;
  int max_depth = 0;
  build_root_program(geometry, nodes, geometry.tree_levels(), 0, ops, 0, max_depth);
  if (max_depth > kMaxStack) {
    throw ContractError("detlogp merge_roots: the tree is deeper than the CUDA kernel's stack");
  }
  const bool with_entropy = !roots.entropy.empty();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const size_t ops_bytes = align_up(ops.size() * sizeof(int32_t));
  const size_t in_bytes = align_up(partials.size() * 3 * sizeof(float));
  const size_t out_bytes = align_up(static_cast<size_t>(rows) * 2 * sizeof(float));
  const size_t total = ops_bytes + in_bytes + out_bytes;
  impl_->scratch.reserve(total, total);
  char* dev = impl_->scratch.device();
  char* host = impl_->scratch.host();
  std::memcpy(host, ops.data(), ops.size() * sizeof(int32_t));
  auto* hp = reinterpret_cast<float*>(host + ops_bytes);
  for (size_t i = 0; i < partials.size(); ++i) {
    hp[3 * i] = partials[i].m;
    hp[3 * i + 1] = partials[i].s;
    hp[3 * i + 2] = partials[i].u;
  }
  check(cudaMemcpyAsync(dev, host, ops_bytes + in_bytes, cudaMemcpyHostToDevice, impl_->stream),
        "cudaMemcpyAsync (root inputs)");
  auto* d_lse = reinterpret_cast<float*>(dev + ops_bytes + in_bytes);
  float* d_entropy = d_lse + rows;
  const unsigned blocks = static_cast<unsigned>((rows + 127) / 128);
  const auto* d_ops = reinterpret_cast<const int32_t*>(dev);
  const auto* d_partials = reinterpret_cast<const float*>(dev + ops_bytes);
  const auto n_nodes = static_cast<int64_t>(nodes.size());
  if (with_entropy) {
    merge_roots_kernel<true><<<blocks, 128, 0, impl_->stream>>>(
        d_ops, static_cast<int>(ops.size()), d_partials, n_nodes, rows, d_lse, d_entropy);
  } else {
    merge_roots_kernel<false><<<blocks, 128, 0, impl_->stream>>>(
        d_ops, static_cast<int>(ops.size()), d_partials, n_nodes, rows, d_lse, d_entropy);
  }
  impl_->launched("merge_roots_kernel launch");
  char* h_out = host + ops_bytes + in_bytes;
  check(cudaMemcpyAsync(h_out, d_lse, static_cast<size_t>(rows) * 2 * sizeof(float),
                        cudaMemcpyDeviceToHost, impl_->stream),
        "cudaMemcpyAsync (roots)");
  impl_->sync();
  const auto* lse = reinterpret_cast<const float*>(h_out);
  std::copy(lse, lse + rows, roots.lse.begin());
  if (with_entropy) std::copy(lse + rows, lse + 2 * rows, roots.entropy.begin());
}

void CudaShardKernels::backward(const LogitsView& shard, const ShardSpec& spec,
                                const BackwardInputs& in, const MutableLogitsView& grad,
                                const ExecOptions&) const {
  kernels::validate_backward(shard, spec, in, grad);
  if (shard.rows == 0 || shard.cols == 0) return;
  require_device_pointer(shard.data, "backward", "shard.data");
  require_device_pointer(grad.data, "backward", "grad.data");
  const auto rows = static_cast<size_t>(shard.rows);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  // Per-row inputs: 5 float arrays, then the targets.
  const size_t floats_bytes = align_up(rows * 5 * sizeof(float));
  const size_t total = floats_bytes + align_up(rows * sizeof(int64_t));
  impl_->scratch.reserve(total, total);
  char* dev = impl_->scratch.device();
  char* host = impl_->scratch.host();
  auto* hf = reinterpret_cast<float*>(host);
  auto put = [&](int slot, std::span<const float> v) {
    if (!v.empty()) std::copy(v.begin(), v.end(), hf + slot * rows);
  };
  const bool has_entropy = !in.grad_entropy.empty();
  put(0, in.lse);
  if (has_entropy) put(1, in.entropy);
  put(2, in.grad_logp);
  put(3, in.grad_lse);
  put(4, in.grad_entropy);
  std::copy(in.target_local.begin(), in.target_local.end(),
            reinterpret_cast<int64_t*>(host + floats_bytes));
  check(cudaMemcpyAsync(dev, host, total, cudaMemcpyHostToDevice, impl_->stream),
        "cudaMemcpyAsync (backward inputs)");
  const auto* df = reinterpret_cast<const float*>(dev);
  BackwardJob job{};
  job.data = shard.data;
  job.row_stride = shard.row_stride;
  job.grad = grad.data;
  job.grad_row_stride = grad.row_stride;
  job.rows = shard.rows;
  job.cols = shard.cols;
  job.real_cols = std::clamp<int64_t>(spec.geometry.real_vocab - spec.vocab_start, 0, shard.cols);
  job.temperature = spec.temperature;
  job.has_logp = !in.grad_logp.empty();
  job.has_lse = !in.grad_lse.empty();
  job.has_entropy = has_entropy;
  job.lse = df;
  job.entropy = df + rows;
  job.grad_logp = df + 2 * rows;
  job.grad_lse = df + 3 * rows;
  job.grad_entropy = df + 4 * rows;
  job.target = reinterpret_cast<const int64_t*>(dev + floats_bytes);
  const size_t es = dtype_size(shard.dtype);
  const bool aligned = reinterpret_cast<uintptr_t>(shard.data) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(grad.data) % 16 == 0 &&
                       (static_cast<size_t>(shard.row_stride) * es) % 16 == 0 &&
                       (static_cast<size_t>(grad.row_stride) * es) % 16 == 0;
  const int64_t vec = shard.dtype == DType::fp32 ? 4 : 8;
  const int64_t groups = (shard.cols + vec - 1) / vec;
  const dim3 grid(static_cast<unsigned>((groups + 255) / 256),
                  static_cast<unsigned>(std::min<int64_t>(shard.rows, 65535)));
  dispatch_dtype(shard.dtype, [&](auto dt) {
    constexpr int D = decltype(dt)::value;
    if (aligned) {
      backward_kernel<D, true><<<grid, 256, 0, impl_->stream>>>(job);
    } else {
      backward_kernel<D, false><<<grid, 256, 0, impl_->stream>>>(job);
    }
  });
  impl_->launched("backward_kernel launch");
  impl_->sync();
}

void CudaShardKernels::read_target_logits(const LogitsView& shard, const ShardSpec& spec,
                                          std::span<const int64_t> target_local,
                                          std::span<float> out) const {
  const char* kernel = "read_target_logits";
  kernels::validate_shard(shard, spec, kernel);
  kernels::validate_targets(shard, spec, target_local, kernel);
  if (static_cast<int64_t>(out.size()) != shard.rows) {
    throw ContractError("detlogp read_target_logits: out has " + std::to_string(out.size()) +
                        " entries, expected rows = " + std::to_string(shard.rows));
  }
  if (shard.rows == 0) return;
  const bool any_target =
      std::any_of(target_local.begin(), target_local.end(), [](int64_t t) { return t >= 0; });
  if (!any_target) {
    std::fill(out.begin(), out.end(), 0.0f);
    return;
  }
  require_device_pointer(shard.data, kernel, "shard.data");
  const auto rows = static_cast<size_t>(shard.rows);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const size_t t_bytes = align_up(rows * sizeof(int64_t));
  const size_t total = t_bytes + align_up(rows * sizeof(float));
  impl_->scratch.reserve(total, total);
  char* dev = impl_->scratch.device();
  char* host = impl_->scratch.host();
  std::copy(target_local.begin(), target_local.end(), reinterpret_cast<int64_t*>(host));
  check(cudaMemcpyAsync(dev, host, rows * sizeof(int64_t), cudaMemcpyHostToDevice, impl_->stream),
        "cudaMemcpyAsync (targets)");
  const unsigned blocks = static_cast<unsigned>((rows + 127) / 128);
  dispatch_dtype(shard.dtype, [&](auto dt) {
    constexpr int D = decltype(dt)::value;
    read_targets_kernel<D><<<blocks, 128, 0, impl_->stream>>>(
        shard.data, shard.row_stride, shard.rows, reinterpret_cast<const int64_t*>(dev),
        spec.temperature, reinterpret_cast<float*>(dev + t_bytes));
  });
  impl_->launched("read_targets_kernel launch");
  check(cudaMemcpyAsync(host + t_bytes, dev + t_bytes, rows * sizeof(float), cudaMemcpyDeviceToHost,
                        impl_->stream),
        "cudaMemcpyAsync (target logits)");
  impl_->sync();
  const auto* h = reinterpret_cast<const float*>(host + t_bytes);
  std::copy(h, h + rows, out.begin());
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
