// node_partials on the device: one block per row (rows strided over the grid), the row's nodes
// one after another. A node is cut into aligned chunks of up to 2^8 tiles:
//
//   1. each busy warp computes the leaves of up to 32 consecutive tiles (lane i keeps leaf i)
//      and reduces them pairwise, merge(2i, 2i+1), level by level (warp_tree);
//   2. warp 0 reduces the warps' roots the same way, in tile order: the chunk's root;
//   3. thread 0 combines the node's chunk roots left to right with a binary counter
//      (merge(older, newer) whenever two equal levels meet).
//
// Every internal node is canon::merge(left child, right child), as in the canon's tree.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/warp.cuh"
#include "numerics/canon.hpp"
#include "numerics/element_io.hpp"

namespace detlogp::cuda_impl {
namespace {

constexpr int kWarps = 8;  // warps per block
constexpr int kBlock = kWarps * kWarp;
constexpr int kTilesPerWarp = 32;  // one aligned run of leaves per warp
constexpr int kChunkLevel = 8;     // a chunk covers 2^8 = kWarps * kTilesPerWarp tiles
static_assert((1 << kChunkLevel) == kWarps * kTilesPerWarp, "a chunk is one block step");
constexpr int kSmallPerLane = 4;  // W <= 128: a tile stays in registers
constexpr int kCounterDepth = 64;

// Real columns of tile t (0 at or beyond T).
__device__ __forceinline__ int tile_count(const NodePartialsJob& job, int64_t t) {
  const int64_t b = t * job.tile_width;
  const int64_t e = b + job.tile_width < job.real_vocab ? b + job.tile_width : job.real_vocab;
  return e > b ? static_cast<int>(e - b) : 0;
}

// The raw elements of a tile held by this lane: x[i] is element lane + 32 i (when < count).
template <DType kDT>
__device__ __forceinline__ void load_tile(const void* __restrict__ row, int64_t local_begin,
                                          int count, int lane, float (&x)[kSmallPerLane]) {
#pragma unroll
  for (int i = 0; i < kSmallPerLane; ++i) {
    const int k = lane + kWarp * i;
    x[i] = k < count ? numerics::load_as_float<kDT>(row, local_begin + k) : 0.0f;
  }
}

// Step 1 for W <= 128: the leaves of tiles [t0, t0 + per_warp), each tile in registers, the next
// one loaded while this one is reduced. Lane i returns leaf t0 + i.
template <DType kDT, bool kEntropy>
__device__ canon::Partial warp_leaves_small(const NodePartialsJob& job, const void* row, int64_t t0,
                                            int per_warp, int64_t real_tiles, int lane) {
  canon::Partial mine = canon::identity_partial();
  float x[kSmallPerLane];
  int count = t0 < real_tiles ? tile_count(job, t0) : 0;
  if (count > 0) load_tile<kDT>(row, t0 * job.tile_width - job.vocab_start, count, lane, x);
  for (int i = 0; i < per_warp; ++i) {
    float next[kSmallPerLane];
    const int64_t tn = t0 + i + 1;
    const int next_count = (i + 1 < per_warp && tn < real_tiles) ? tile_count(job, tn) : 0;
    if (next_count > 0) {
      load_tile<kDT>(row, tn * job.tile_width - job.vocab_start, next_count, lane, next);
    }
    canon::Partial leaf = canon::identity_partial();
    if (count > 0) {
      float z[kSmallPerLane];
#pragma unroll
      for (int q = 0; q < kSmallPerLane; ++q) z[q] = canon::scale_logit(x[q], job.temperature);
      leaf = leaf_from_registers<kEntropy, kSmallPerLane>(z, count, lane);
    }
    if (lane == i) mine = leaf;
#pragma unroll
    for (int q = 0; q < kSmallPerLane; ++q) x[q] = next[q];
    count = next_count;
  }
  return mine;
}

// Step 1 for any W: the same, each tile read twice from memory (max, then sums).
template <DType kDT, bool kEntropy>
__device__ canon::Partial warp_leaves_any_width(const NodePartialsJob& job, const void* row,
                                                int64_t t0, int per_warp, int64_t real_tiles,
                                                int lane) {
  canon::Partial mine = canon::identity_partial();
  for (int i = 0; i < per_warp; ++i) {
    const int64_t t = t0 + i;
    canon::Partial leaf = canon::identity_partial();
    if (t < real_tiles) {
      leaf = leaf_any_width<kDT, kEntropy>(row, t * job.tile_width - job.vocab_start,
                                           tile_count(job, t), job.temperature, lane);
    }
    if (lane == i) mine = leaf;
  }
  return mine;
}

// Steps 1 and 2: the root of the chunk of 2^chunk_level tiles at `chunk` (< T), in warp 0 (its
// other lanes and the other warps return values nobody reads). Every thread of the block calls
// it (it holds a barrier). `roots` is double-buffered by `parity`, so that the next chunk's
// writes never race this chunk's reads without a second barrier.
template <DType kDT, bool kEntropy, bool kSmall>
__device__ canon::Partial chunk_root(const NodePartialsJob& job, const void* row, int64_t chunk,
                                     int chunk_level, int64_t real_tiles,
                                     canon::Partial (&roots)[2][kWarps], int& parity) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int64_t chunk_tiles = int64_t{1} << chunk_level;
  const int per_warp = static_cast<int>(chunk_tiles < kTilesPerWarp ? chunk_tiles : kTilesPerWarp);
  const int busy_warps = static_cast<int>(chunk_tiles / per_warp);
  if (warp < busy_warps) {
    const int64_t t0 = chunk + static_cast<int64_t>(warp) * per_warp;
    canon::Partial mine;
    if constexpr (kSmall) {
      mine = warp_leaves_small<kDT, kEntropy>(job, row, t0, per_warp, real_tiles, lane);
    } else {
      mine = warp_leaves_any_width<kDT, kEntropy>(job, row, t0, per_warp, real_tiles, lane);
    }
    mine = warp_tree<kEntropy>(mine, per_warp, lane);
    if (lane == 0) roots[parity][warp] = mine;
  }
  __syncthreads();
  canon::Partial root = canon::identity_partial();
  if (warp == 0) {
    const canon::Partial mine = lane < busy_warps ? roots[parity][lane] : canon::identity_partial();
    root = warp_tree<kEntropy>(mine, busy_warps, lane);
  }
  parity ^= 1;
  return root;
}

// Step 3: a binary counter of chunk roots (thread 0 only). After the node's chunks, left to
// right, partials[0] is the node's partial.
struct ChunkCounter {
  canon::Partial partials[kCounterDepth];
  int levels[kCounterDepth];
  int size;

  template <bool kEntropy>
  __device__ void push(const canon::Partial& p, int level) {
    partials[size] = p;
    levels[size] = level;
    ++size;
    while (size >= 2 && levels[size - 1] == levels[size - 2]) {
      partials[size - 2] = canon::merge<kEntropy>(partials[size - 2], partials[size - 1]);
      ++levels[size - 2];
      --size;
    }
  }
};

template <DType kDT, bool kEntropy, bool kSmall>
__global__ void __launch_bounds__(kBlock) node_partials_kernel(NodePartialsJob job) {
  __shared__ canon::Partial warp_roots[2][kWarps];
  __shared__ ChunkCounter counter;
  const int64_t real_tiles = (job.real_vocab + job.tile_width - 1) / job.tile_width;
  int parity = 0;
  for (int64_t r = blockIdx.x; r < job.rows; r += gridDim.x) {
    const void* row = static_cast<const char*>(job.data) +
                      static_cast<size_t>(r * job.row_stride) * (kDT == DType::fp32 ? 4 : 2);
    for (int64_t j = 0; j < job.num_nodes; ++j) {
      const int level = job.nodes[j].level;
      const int64_t first = job.nodes[j].index << level;
      const int chunk_level = level < kChunkLevel ? level : kChunkLevel;
      if (threadIdx.x == 0) counter.size = 0;
      for (int64_t chunk = first; chunk < first + (int64_t{1} << level);
           chunk += int64_t{1} << chunk_level) {
        // A chunk at or beyond T holds only padding tiles: the identity (a uniform branch).
        const canon::Partial root =
            chunk < real_tiles ? chunk_root<kDT, kEntropy, kSmall>(job, row, chunk, chunk_level,
                                                                   real_tiles, warp_roots, parity)
                               : canon::identity_partial();
        if (threadIdx.x == 0) counter.push<kEntropy>(root, chunk_level);
      }
      if (threadIdx.x == 0) job.out[r * job.num_nodes + j] = counter.partials[0];
    }
  }
}

}  // namespace

void launch_node_partials(const NodePartialsJob& job, int multiprocessors, cudaStream_t stream) {
  const int64_t blocks = std::min<int64_t>(job.rows, int64_t{multiprocessors} * 16);
  const bool small = job.tile_width <= kWarp * kSmallPerLane;
  dispatch_dtype(job.dtype, [&](auto dt) {
    constexpr DType D = decltype(dt)::value;
    auto launch = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(job);
    };
    if (job.with_entropy) {
      small ? launch(node_partials_kernel<D, true, true>)
            : launch(node_partials_kernel<D, true, false>);
    } else {
      small ? launch(node_partials_kernel<D, false, true>)
            : launch(node_partials_kernel<D, false, false>);
    }
  });
}

}  // namespace detlogp::cuda_impl
