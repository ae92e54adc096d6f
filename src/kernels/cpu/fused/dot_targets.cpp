// The fused lm_head's dense kernels on SIMD vectors, compiled once per Highway target. Every
// lane performs exactly the fma/add sequence of the scalar canon (numerics/linear_canon.hpp):
//
// - Dot products: the canon's 16 accumulator lanes are kDotLanes / N vectors of N lanes (1 with
//   AVX-512, 2 with AVX2, 4 with SSE4), so element k lands in canon lane k mod 16 whatever N is.
//   A register block of MR hidden rows x NR weight rows shares every load; the k tail is run on
//   zero-filled copies, which is the canon's +0 * +0 padding. A tile runs column block by
//   column block (each block of weight rows read from memory once, then from L2). The fold's first
//   steps (h >= N) are vector adds of whole registers, the rest adds the register's halves.
//   AVX2 runs tiles of at least 24 x 64 x 512 as one matrix product per canon lane
//   (DotTileLanes: each accumulator element is one lane's chain, folded across lane planes),
//   and smaller ones with the two registers' lanes (0-7, 8-15) as separate halves over packed
//   k chunks (DotTileHalves): one register per output leaves room for 4 x 3 blocks. The op's
//   row block is packed once for all its tiles (PackRows / DotPacked).
// - Gradient chains: each output element is its own fma chain, vectorised along the hidden
//   dimension; a block of MI outputs shares each loaded vector and reads its coefficients from
//   a packed panel. The values are packed a chunk of hidden blocks at a time into contiguous
//   panels that stay in L2 while every output block runs its chain over them (or once for many
//   calls: PackValues / ChainPacked).
//
// fma is the hardware instruction where Highway's MulAdd is fused (HWY_NATIVE_FMA), std::fma
// per lane otherwise. Never compiled with fast-math or FP contraction (-ffp-contract=off).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/fused/dot_kernels.hpp"
#include "numerics/linear_canon.hpp"

// Same target set as the shard kernels (kernels/cpu/simd/simd_targets.cpp).
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_AVX3_DL)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/fused/dot_targets.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway headers after foreach_target.h.
#include <hwy/highway.h>
#include "kernels/cpu/simd/lanes-inl.h"

HWY_BEFORE_NAMESPACE();
namespace detlogp::fused {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR

using DF = hn::CappedTag<float, canon::kDotLanes>;
using VF = hn::Vec<DF>;

constexpr int64_t kN = static_cast<int64_t>(hn::MaxLanes(DF()));
constexpr int kKV = static_cast<int>(canon::kDotLanes / kN);  // vectors per 16 canon lanes
static_assert(kN * kKV == canon::kDotLanes, "the vector length must divide 16");

// Register blocks: MR x NR dot products of kKV accumulators each (12 or 16 registers).
constexpr int kMR = kKV >= 4 ? 1 : (kKV == 2 ? 2 : 4);
constexpr int kNR = kKV == 1 ? 4 : 3;
// Gradient chains: kMI outputs x kU vectors per block: 12 independent fma chains cover the fma
// latency; with AVX-512's 32 registers, 16 (4 vectors, a 256-byte row of the packed panel, one
// broadcast per 4 fmas) run the chains 20-30% faster than 12. With 16 registers (AVX2, SSE4)
// 16 accumulators would spill. On AVX2 (Zen 3) 6 outputs x 2 vectors (2 vector loads + 6
// broadcasts per 12 fmas) ran the chains 1.2-1.4x faster than 4 x 3 (3 + 4): the vector loads,
// not the broadcasts, set the speed; 8 x 2 spills and 12 x 1 was slower.
constexpr int kMI = kN == 8 ? 6 : 4;
constexpr int kU = kN >= 16 ? 4 : (kN == 8 ? 2 : 3);
constexpr int64_t kStep = kU * kN;  // hidden elements per chain block

// a * b + c with one rounding (the shard kernels' fma, lanes-inl.h).
HWY_INLINE VF Fma(VF a, VF b, VF c) { return simd::HWY_NAMESPACE::FusedMulAdd(DF(), a, b, c); }

// Keeps a loaded vector in a register. GCC otherwise folds the load into every fma that uses
// it (a memory operand per fma): with AVX2's 2 x 3 block that is 8 loads per 6 fmas instead of
// 5, and the loads, not the fmas, set the speed. An empty asm: no instruction, no effect on
// the value.
HWY_INLINE void InRegister(VF& v) {
#if HWY_ARCH_X86 && (HWY_COMPILER_GCC || HWY_COMPILER_CLANG)
  asm("" : "+x"(v.raw));
#else
  (void)v;
#endif
}

// One 16-element chunk of MR x NR dot products.
template <int MR, int NR>
HWY_INLINE void DotChunk(const float* const* a, const float* const* b, int64_t at,
                         VF (&acc)[MR][NR][kKV]) {
  const DF d;
  for (int v = 0; v < kKV; ++v) {
    VF av[MR];
    for (int r = 0; r < MR; ++r) av[r] = hn::LoadU(d, a[r] + at + v * kN);
    for (int c = 0; c < NR; ++c) {
      VF bv = hn::LoadU(d, b[c] + at + v * kN);
      InRegister(bv);
      for (int r = 0; r < MR; ++r) acc[r][c][v] = Fma(av[r], bv, acc[r][c][v]);
    }
  }
}

// The canon's in-register fold h = N/2 .. 1: lane j of the lower half plus lane j of the upper
// half (lane[j] + lane[j + h]), halving the vector down to one lane.
template <class D>
HWY_INLINE float FoldHalves(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(D()) == 1) {
    (void)d;
    return hn::GetLane(v);
  } else {
    const hn::Half<D> dh;
    return FoldHalves(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  }
}

// The canon's lane fold of one dot product's accumulators: h = 8 .. N as whole-vector adds,
// then h = N/2 .. 1 by halves of the register.
HWY_INLINE float FoldLanes(VF (&v)[kKV]) {
  for (int w = kKV; w > 1; w /= 2) {
    for (int j = 0; j < w / 2; ++j) v[j] = hn::Add(v[j], v[j + w / 2]);
  }
  return canon::canonicalize(FoldHalves(DF(), v[0]));
}

template <int MR, int NR>
HWY_INLINE void DotBlock(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k,
                         float* out, int64_t ldo) {
  const DF d;
  VF acc[MR][NR][kKV];
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NR; ++c) {
      for (int v = 0; v < kKV; ++v) acc[r][c][v] = hn::Zero(d);
    }
  }
  const float* ar[MR];
  const float* bc[NR];
  for (int r = 0; r < MR; ++r) ar[r] = a + r * lda;
  for (int c = 0; c < NR; ++c) bc[c] = b + c * ldb;
  const int64_t full = k / canon::kDotLanes * canon::kDotLanes;
  for (int64_t at = 0; at < full; at += canon::kDotLanes) DotChunk<MR, NR>(ar, bc, at, acc);
  if (full < k) {  // the canon's zero padding up to a multiple of 16
    HWY_ALIGN float ta[MR][canon::kDotLanes] = {};
    HWY_ALIGN float tb[NR][canon::kDotLanes] = {};
    const auto tail = static_cast<size_t>(k - full) * sizeof(float);
    const float* pa[MR];
    const float* pb[NR];
    for (int r = 0; r < MR; ++r) {
      std::memcpy(ta[r], ar[r] + full, tail);
      pa[r] = ta[r];
    }
    for (int c = 0; c < NR; ++c) {
      std::memcpy(tb[c], bc[c] + full, tail);
      pb[c] = tb[c];
    }
    DotChunk<MR, NR>(pa, pb, 0, acc);
  }
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < NR; ++c) out[r * ldo + c] = FoldLanes(acc[r][c]);
  }
}

// Column block [j, j + NR) of the tile: its MR x NR register blocks down every row.
template <int NR>
HWY_INLINE void DotColumns(const float* a, int64_t lda, int64_t m, const float* b, int64_t ldb,
                           int64_t k, float* out, int64_t ldo) {
  int64_t i = 0;
  for (; i + kMR <= m; i += kMR) DotBlock<kMR, NR>(a + i * lda, lda, b, ldb, k, out + i * ldo, ldo);
  for (; i < m; ++i) DotBlock<1, NR>(a + i * lda, lda, b, ldb, k, out + i * ldo, ldo);
}

// Groups of kUnblockedRows rows; in each, column blocks outside, rows inside: the NR weight
// rows of a column block (NR x H floats, 48-64 KiB at H = 4096) come from memory once and then
// from L2 for every register row block of the group, while the group's hidden rows (512 KiB at
// 32 x 4096) stay in L2 across column blocks. Rows outside would stream the whole [W, H] weight
// tile (2 MiB at W = 128), larger than L2, from L3 once per register row block; a group of all
// of the op's row block (96 x 4096, 1.5 MiB) would not stay in a 1 MiB L2. Each output is still
// one DotBlock, so the order of the blocks never changes a bit.
constexpr int64_t kUnblockedRows = 32;

void DotTileUnblocked(const float* a, int64_t lda, int64_t m, const float* b, int64_t ldb,
                      int64_t n, int64_t k, float* out, int64_t ldo) {
  for (int64_t r0 = 0; r0 < m; r0 += kUnblockedRows) {
    const float* ar = a + r0 * lda;
    const int64_t mr = std::min(kUnblockedRows, m - r0);
    float* orow = out + r0 * ldo;
    int64_t j = 0;
    for (; j + kNR <= n; j += kNR) DotColumns<kNR>(ar, lda, mr, b + j * ldb, ldb, k, orow + j, ldo);
    for (; j < n; ++j) DotColumns<1>(ar, lda, mr, b + j * ldb, ldb, k, orow + j, ldo);
  }
}

// AVX2: 16 canon lanes are two registers, so a block of 2 x 3 dot products needs 12
// accumulators and loads 5 vectors per 6 fmas: the loads, not the fmas, set the speed. But the
// canon's lanes 0-7 and 8-15 are independent chains, so the tile runs them as two halves, one
// register per dot product: a block of kHR hidden rows x kHC weight rows loads kHR + kHC vectors
// per kHR * kHC fmas (7 per 12 for 4 x 3; 12 accumulators + 3 weight vectors + 1 hidden vector
// = 16 registers). The halves pause between chunks of kKC elements of k (each half's
// accumulators stored and reloaded as they are: a chain that pauses changes no bit). The tile
// runs in groups of kGroupRows hidden rows whose k chunk is packed contiguously (24 KiB: rows a
// hidden size apart would all land in the same L1 set) and stays in L1 while every register
// block of the group reads it twice (once per half); the weight rows are read in place, from
// L2, once per group. Each lane still accumulates its elements in increasing k from +0 (the
// chunk past k on zero-filled copies, the canon's padding), and the fold is DotBlock's.
// Measured on Zen 3 (docs/benchmarks.md): 1.2-1.3x the unblocked 2 x 3 tile; packing the
// weight chunks too, or groups of 4 or 8 rows, were slower.
constexpr int kHR = 4;
constexpr int kHC = 3;
constexpr int64_t kKC = 384;
constexpr int64_t kGroupRows = 16;

// Half v (lanes v * N .. v * N + N - 1) of MR x NR dot products over the 16-element chunks at
// [from, to): acc[r][c] += a_r * b_c elementwise, element at + v * N + lane of every chunk.
template <int MR, int NR>
HWY_INLINE void HalfChunks(const float* const* a, const float* const* b, int64_t from, int64_t to,
                           int v, VF (&acc)[MR][NR]) {
  const DF d;
  for (int64_t at = from; at < to; at += canon::kDotLanes) {
    VF bv[NR];
    for (int c = 0; c < NR; ++c) bv[c] = hn::LoadU(d, b[c] + at + v * kN);
    for (int r = 0; r < MR; ++r) {
      VF av = hn::LoadU(d, a[r] + at + v * kN);
      InRegister(av);
      for (int c = 0; c < NR; ++c) acc[r][c] = Fma(av, bv[c], acc[r][c]);
    }
  }
}

// One MR x NR register block over one packed k chunk of len elements (a multiple of 16).
// state holds the paused lanes: [MR][NR][16] floats.
template <int MR, int NR>
HWY_INLINE void HalvesBlock(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t len,
                            float* state, bool first, bool last, float* out, int64_t ldo) {
  const DF d;
  const float* ar[MR];
  const float* bc[NR];
  for (int r = 0; r < MR; ++r) ar[r] = a + r * lda;
  for (int c = 0; c < NR; ++c) bc[c] = b + c * ldb;
  for (int v = 0; v < kKV; ++v) {
    VF acc[MR][NR];
    for (int r = 0; r < MR; ++r) {
      for (int c = 0; c < NR; ++c) {
        acc[r][c] =
            first ? hn::Zero(d) : hn::LoadU(d, state + (r * NR + c) * canon::kDotLanes + v * kN);
      }
    }
    HalfChunks<MR, NR>(ar, bc, 0, len, v, acc);
    for (int r = 0; r < MR; ++r) {
      for (int c = 0; c < NR; ++c) {
        hn::StoreU(acc[r][c], d, state + (r * NR + c) * canon::kDotLanes + v * kN);
      }
    }
  }
  if (last) {
    for (int r = 0; r < MR; ++r) {
      for (int c = 0; c < NR; ++c) {
        VF lanes[kKV];
        for (int v = 0; v < kKV; ++v) {
          lanes[v] = hn::LoadU(d, state + (r * NR + c) * canon::kDotLanes + v * kN);
        }
        out[r * ldo + c] = FoldLanes(lanes);
      }
    }
  }
}

// Copies elements [from, from + len) of `rows` rows (ld apart) into a contiguous [rows, len]
// block, zero past k (the canon's padding). Rows a hidden size apart (16 KiB at H = 4096) would
// all land in the same L1 set; packed, a chunk stays in L1.
HWY_INLINE void PackChunk(const float* src, int64_t ld, int64_t rows, int64_t from, int64_t len,
                          int64_t k, float* dst) {
  const int64_t real = std::min(len, k - from);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * len, src + r * ld + from, static_cast<size_t>(real) * sizeof(float));
    std::fill(dst + r * len + real, dst + (r + 1) * len, 0.0f);
  }
}

// Column block [j, j + NR) of a packed row group chunk: its register blocks down the rows.
template <int NR>
HWY_INLINE void HalvesColumns(const float* ag, int64_t m, const float* b, int64_t ldb, int64_t from,
                              int64_t len, int64_t k, float* bpack, float* state, bool first,
                              bool last, float* out, int64_t ldo) {
  const float* bp = b + from;
  int64_t lb = ldb;
  if (from + len > k) {  // the chunk past k: zero-padded copies
    PackChunk(b, ldb, NR, from, len, k, bpack);
    bp = bpack;
    lb = len;
  }
  constexpr int64_t kRowState = NR * canon::kDotLanes;
  int64_t i = 0;
  for (; i + kHR <= m; i += kHR) {
    HalvesBlock<kHR, NR>(ag + i * len, len, bp, lb, len, state + i * kRowState, first, last,
                         out + i * ldo, ldo);
  }
  for (; i < m; ++i) {
    HalvesBlock<1, NR>(ag + i * len, len, bp, lb, len, state + i * kRowState, first, last,
                       out + i * ldo, ldo);
  }
}

void DotTileHalves(const float* a, int64_t lda, int64_t m, const float* b, int64_t ldb, int64_t n,
                   int64_t k, float* out, int64_t ldo) {
  const int64_t padded = (k + canon::kDotLanes - 1) / canon::kDotLanes * canon::kDotLanes;
  // Paused lanes of the current row group: column j's block at j * kGroupRows * 16 floats,
  // then [row][NR][16].
  const auto state_size = static_cast<size_t>(kGroupRows * (n + kHC) * canon::kDotLanes);
  thread_local std::vector<float> state;
  thread_local std::vector<float> apack(static_cast<size_t>(kGroupRows * kKC));
  thread_local std::vector<float> bpack(static_cast<size_t>(kHC * kKC));
  if (state.size() < state_size) state.resize(state_size);
  for (int64_t r0 = 0; r0 < m; r0 += kGroupRows) {
    const int64_t mg = std::min(kGroupRows, m - r0);
    float* og = out + r0 * ldo;
    for (int64_t from = 0; from < padded; from += kKC) {
      const int64_t len = std::min(padded, from + kKC) - from;
      const bool first = from == 0;
      const bool last = from + len == padded;
      PackChunk(a + r0 * lda, lda, mg, from, len, k, apack.data());
      int64_t j = 0;
      for (; j + kHC <= n; j += kHC) {
        HalvesColumns<kHC>(apack.data(), mg, b + j * ldb, ldb, from, len, k, bpack.data(),
                           state.data() + j * kGroupRows * canon::kDotLanes, first, last, og + j,
                           ldo);
      }
      for (; j < n; ++j) {
        HalvesColumns<1>(apack.data(), mg, b + j * ldb, ldb, from, len, k, bpack.data(),
                         state.data() + j * kGroupRows * canon::kDotLanes, first, last, og + j,
                         ldo);
      }
    }
  }
}

#if HWY_TARGET == HWY_AVX2
// AVX2, the lane GEMM: lane l of output (i, c) is the chain over q of x[i][16q + l] *
// w[c][16q + l] in increasing q from +0, so for a fixed l the tile is an ordinary matrix product
// C_l = X_l W_l^T over K' = padded k / 16 terms, where X_l and W_l hold the lane-l elements.
// The tile packs both operands lane-major once (8 x 8 transposes): the hidden rows per panel of
// 16 rows (16 rows contiguous per q), the weight rows per block of 6 (6 elements contiguous per
// q). The register block is BLAS's: 6 weight rows x 2 vectors of 8 hidden rows = 12
// accumulators, per q 2 vector loads and 6 broadcasts, both from sequential streams, per 12
// fmas. Each accumulator is exactly one canon lane chain, all K' terms in q order from +0 in
// one register (the hidden rows packed with +0 past k and the weight rows' chunk past k from
// zero-filled copies: the canon's padding); then the canon's fold, h = 8, 4, 2, 1, as vector
// adds of whole lane planes (15 adds per 8 outputs). Lanes run outermost: a lane's packed
// rows (96 KiB at 96 x 4096) and weight elements (132 KiB at 128 x 4096) stay in L2 while
// every block runs, and a block's elements (6 KiB) stay in L1 over the panels. Packing the
// weights costs about as much per tile as packing the hidden rows, so it pays only over enough
// rows: groups of 96 (the op's row block). Measured on Zen 3 (docs/benchmarks.md): 1.15x the
// same GEMM reading the weights in place with chains paused every 32 terms; at 32 rows the two
// are even.
constexpr int64_t kLC = 6;             // weight rows per register block (broadcasts)
constexpr int64_t kLP = 2 * kN;        // hidden rows per packed panel (2 vectors)
constexpr int64_t kLaneRows = 96;      // rows per group (the op's row block)
constexpr int64_t kLaneCols = 128;     // columns per group (the op's tile)
constexpr int64_t kLanesMinRows = 24;  // fewer rows, columns or elements: DotTileHalves
constexpr int64_t kLanesMinCols = 64;
constexpr int64_t kLanesMinK = 512;

// The 8 x 8 transpose of rows r[0..7]: r[j] becomes element j of every input row.
HWY_INLINE void Transpose8(VF (&r)[8]) {
  const DF d;
  const hn::Repartition<double, DF> dd;
  VF t[8];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = hn::InterleaveLower(d, r[2 * p], r[2 * p + 1]);
    t[2 * p + 1] = hn::InterleaveUpper(d, r[2 * p], r[2 * p + 1]);
  }
  VF u[8];
  for (int p = 0; p < 2; ++p) {  // rows 4p .. 4p + 3
    const auto a0 = hn::BitCast(dd, t[4 * p]), a1 = hn::BitCast(dd, t[4 * p + 1]);
    const auto b0 = hn::BitCast(dd, t[4 * p + 2]), b1 = hn::BitCast(dd, t[4 * p + 3]);
    u[4 * p] = hn::BitCast(d, hn::InterleaveLower(dd, a0, b0));      // elements 0 | 4
    u[4 * p + 1] = hn::BitCast(d, hn::InterleaveUpper(dd, a0, b0));  // 1 | 5
    u[4 * p + 2] = hn::BitCast(d, hn::InterleaveLower(dd, a1, b1));  // 2 | 6
    u[4 * p + 3] = hn::BitCast(d, hn::InterleaveUpper(dd, a1, b1));  // 3 | 7
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = hn::ConcatLowerLower(d, u[4 + j], u[j]);
    r[j + 4] = hn::ConcatUpperUpper(d, u[4 + j], u[j]);
  }
}

// Packs 8 rows (src + r * ld; rows r >= valid are zeros) lane-major: dst[l * lane_stride + q *
// q_stride + r] = element 16 q + l of row r, for q < kp, +0 past k.
HWY_INLINE void PackLanes8(const float* src, int64_t ld, int64_t valid, int64_t k, int64_t kp,
                           float* dst, int64_t lane_stride, int64_t q_stride) {
  const DF d;
  HWY_ALIGN float tail[8][canon::kDotLanes] = {};
  const int64_t full = k / canon::kDotLanes;
  const float* rows[8];
  for (int r = 0; r < 8; ++r) rows[r] = r < valid ? src + r * ld : nullptr;
  if (full < kp) {  // the last chunk: its real elements, then the canon's +0 padding
    const auto real = static_cast<size_t>(k - full * canon::kDotLanes) * sizeof(float);
    for (int64_t r = 0; r < valid; ++r)
      std::memcpy(tail[r], src + r * ld + full * canon::kDotLanes, real);
  }
  auto pack = [&](const float* const* p, int64_t at, float* out) {
    for (int h = 0; h < kKV; ++h) {
      VF v[8];
      for (int r = 0; r < 8; ++r) v[r] = hn::LoadU(d, p[r] + at + h * kN);
      Transpose8(v);
      for (int j = 0; j < 8; ++j) hn::StoreU(v[j], d, out + (h * kN + j) * lane_stride);
    }
  };
  if (valid >= 8) {
    for (int64_t q = 0; q < full; ++q) pack(rows, q * canon::kDotLanes, dst + q * q_stride);
  } else {  // missing rows read a zero chunk
    for (int64_t q = 0; q < full; ++q) {
      const float* p[8];
      for (int r = 0; r < 8; ++r)
        p[r] = r < valid ? rows[r] + q * canon::kDotLanes : tail[7];  // row 7: zeros
      pack(p, 0, dst + q * q_stride);
    }
  }
  if (full < kp) {
    const float* p[8];
    for (int r = 0; r < 8; ++r) p[r] = tail[r];
    pack(p, 0, dst + full * q_stride);
  }
}

// NC weight rows x V vectors of 8 hidden rows of one lane, the whole chain (q_count terms from
// +0): x holds the panel's packed rows, 16 per q (lane-major); w the block's packed weight
// elements of this lane, kLC per q (one broadcast each); plane receives the accumulators,
// [kLC][mp] rows.
template <int NC, int V>
HWY_INLINE void LaneBlock(const float* HWY_RESTRICT x, const float* HWY_RESTRICT w, int64_t q_count,
                          float* HWY_RESTRICT plane, int64_t mp) {
  const DF d;
  VF acc[NC][V];
  for (int c = 0; c < NC; ++c) {
    for (int v = 0; v < V; ++v) acc[c][v] = hn::Zero(d);
  }
  for (int64_t q = 0; q < q_count; ++q) {
    VF x0 = hn::Load(d, x + q * kLP);
    InRegister(x0);
    VF x1 = x0;
    if constexpr (V == 2) {
      x1 = hn::Load(d, x + q * kLP + kN);
      InRegister(x1);
    }
    for (int c = 0; c < NC; ++c) {
      const VF wb = hn::Set(d, w[q * kLC + c]);
      acc[c][0] = Fma(wb, x0, acc[c][0]);
      if constexpr (V == 2) acc[c][V - 1] = Fma(wb, x1, acc[c][V - 1]);
    }
  }
  for (int c = 0; c < NC; ++c) {
    for (int v = 0; v < V; ++v) hn::Store(acc[c][v], d, plane + c * mp + v * kN);
  }
}

template <int NC>
HWY_INLINE void LanePanels(const float* x, int64_t xps, int64_t m, const float* w, int64_t q_count,
                           float* plane, int64_t mp) {
  int64_t i = 0;
  for (; i + kLP <= m || (i < m && m - i > kN); i += kLP) {
    LaneBlock<NC, 2>(x + (i / kLP) * xps, w, q_count, plane + i, mp);
  }
  if (i < m) LaneBlock<NC, 1>(x + (i / kLP) * xps, w, q_count, plane + i, mp);
}

// LanePanels by the block's column count (1 .. kLC).
using LanePanelsFn = void (*)(const float*, int64_t, int64_t, const float*, int64_t, float*,
                              int64_t);
constexpr LanePanelsFn kLanePanels[kLC + 1] = {nullptr,        &LanePanels<1>, &LanePanels<2>,
                                               &LanePanels<3>, &LanePanels<4>, &LanePanels<5>,
                                               &LanePanels<6>};
static_assert(kLC == 6, "kLanePanels lists LanePanels<1 .. kLC>");

// Packs the weight rows of one column block (nc <= kLC rows, ld apart; the chunk past k from
// `tail`, 16 zero-padded floats per row) lane-major: dst[l * lane_stride + q * kLC + c] =
// element 16 q + l of row c, for q < kp. Each q is two 8 x 8 transposes (rows past nc are
// zeros) whose 8-float stores overlap the next q's: q ascending, the last one writes 2 floats
// into the lane's slack.
HWY_INLINE void PackWeightLanes(const float* src, int64_t ld, int64_t nc, const float* tail,
                                int64_t full, int64_t kp, float* dst, int64_t lane_stride) {
  const DF d;
  const VF zero = hn::Zero(d);
  for (int64_t q = 0; q < kp; ++q) {
    for (int h = 0; h < kKV; ++h) {
      VF v[8];
      for (int c = 0; c < 8; ++c) {
        if (c >= nc) {
          v[c] = zero;
        } else {
          const float* row =
              q < full ? src + c * ld + q * canon::kDotLanes : tail + c * canon::kDotLanes;
          v[c] = hn::LoadU(d, row + h * kN);
        }
      }
      Transpose8(v);
      for (int j = 0; j < 8; ++j) {
        hn::StoreU(v[j], d, dst + (h * kN + j) * lane_stride + q * kLC);
      }
    }
  }
}

// The canon's fold of a column block's lane planes ([16][kLC][mp]) for rows < m, columns < nc.
HWY_INLINE void FoldPlanes(const float* planes, int64_t mp, int64_t m, int64_t nc, float* out,
                           int64_t ldo) {
  const DF d;
  const int64_t lane_stride = kLC * mp;
  for (int64_t c = 0; c < nc; ++c) {
    for (int64_t i = 0; i < m; i += kN) {
      VF s[canon::kDotLanes];
      for (int l = 0; l < canon::kDotLanes; ++l) {
        s[l] = hn::Load(d, planes + l * lane_stride + c * mp + i);
      }
      for (int h = canon::kDotLanes / 2; h >= 1; h /= 2) {
        for (int j = 0; j < h; ++j) s[j] = hn::Add(s[j], s[j + h]);
      }
      HWY_ALIGN float folded[kN];
      hn::Store(s[0], d, folded);
      const int64_t count = std::min<int64_t>(kN, m - i);
      for (int64_t r = 0; r < count; ++r) out[(i + r) * ldo + c] = canon::canonicalize(folded[r]);
    }
  }
}

// Floats between lane blocks of the packed rows and between their panels, for k elements. Lane
// blocks are 64 bytes more than a multiple of 4 KiB apart: the packing's stores to the 8 lanes
// of a transpose would otherwise alias each other and the next loads (4K aliasing).
constexpr int64_t LaneStride(int64_t kp) { return kp * kLP + canon::kDotLanes; }
constexpr int64_t PanelStride(int64_t kp) { return canon::kDotLanes * LaneStride(kp); }

// Packs rows [0, m) (m <= kLaneRows) lane-major into xpack: [panel][16][kp][kLP rows], +0 past
// k and past m.
void PackRowLanes(const float* a, int64_t lda, int64_t m, int64_t k, float* xpack) {
  const int64_t kp = (k + canon::kDotLanes - 1) / canon::kDotLanes;
  const int64_t mp = (m + kLP - 1) / kLP * kLP;
  for (int64_t r = 0; r < mp; r += 8) {
    PackLanes8(a + r * lda, lda, std::clamp<int64_t>(m - r, 0, 8), k, kp,
               xpack + (r / kLP) * PanelStride(kp) + r % kLP, LaneStride(kp), kLP);
  }
}

// Rows [0, m) (m <= kLaneRows, packed by PackRowLanes) x columns [0, n) (n <= kLaneCols) of the
// lane GEMM.
void DotLanesPacked(const float* xpack, int64_t m, const float* b, int64_t ldb, int64_t n,
                    int64_t k, float* out, int64_t ldo) {
  const int64_t kp = (k + canon::kDotLanes - 1) / canon::kDotLanes;
  const int64_t full = k / canon::kDotLanes;  // chunks of 16 real elements, read in place
  const int64_t mp = (m + kLP - 1) / kLP * kLP;
  const int64_t blocks = (n + kLC - 1) / kLC;
  const int64_t xls = LaneStride(kp);
  const int64_t xps = PanelStride(kp);
  const int64_t wls = kp * kLC + canon::kDotLanes;  // + the overlapping stores' slack
  const int64_t wbs = canon::kDotLanes * wls;
  const int64_t bps = canon::kDotLanes * kLC * mp;  // one column block's lane planes
  thread_local FloatBuffer ts, ws, ps;
  float* wpack = ws.get(static_cast<size_t>(blocks * wbs));   // [block][16][kp][kLC]
  float* planes = ps.get(static_cast<size_t>(blocks * bps));  // [block][16][kLC][mp]
  // The weight rows' last chunk past k: zero-padded copies (the canon's padding).
  float* wtail = ts.get(static_cast<size_t>(n * canon::kDotLanes));  // read only past `full`
  if (full < kp) {
    const auto real = static_cast<size_t>(k - full * canon::kDotLanes) * sizeof(float);
    for (int64_t c = 0; c < n; ++c) {
      std::fill(wtail + c * canon::kDotLanes, wtail + (c + 1) * canon::kDotLanes, 0.0f);
      std::memcpy(wtail + c * canon::kDotLanes, b + c * ldb + full * canon::kDotLanes, real);
    }
  }
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t c0 = block * kLC;
    PackWeightLanes(b + c0 * ldb, ldb, std::min(kLC, n - c0), wtail + c0 * canon::kDotLanes, full,
                    kp, wpack + block * wbs, wls);
  }
  for (int l = 0; l < canon::kDotLanes; ++l) {
    const float* x = xpack + l * xls;
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t nc = std::min(kLC, n - block * kLC);
      const float* w = wpack + block * wbs + l * wls;
      float* plane = planes + block * bps + l * kLC * mp;
      kLanePanels[nc](x, xps, m, w, kp, plane, mp);
    }
  }
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t c0 = block * kLC;
    FoldPlanes(planes + block * bps, mp, m, std::min(kLC, n - c0), out + c0, ldo);
  }
}

// Groups of kLaneRows rows and kLaneCols columns; the last rows, if fewer than kLanesMinRows,
// run DotTileHalves (a lane GEMM of a few rows is slower than it).
void DotTileLanes(const float* a, int64_t lda, int64_t m, const float* b, int64_t ldb, int64_t n,
                  int64_t k, float* out, int64_t ldo) {
  const int64_t kp = (k + canon::kDotLanes - 1) / canon::kDotLanes;
  thread_local FloatBuffer xs;
  float* xpack = xs.get(static_cast<size_t>(kLaneRows / kLP * PanelStride(kp)));
  int64_t r0 = 0;
  for (; r0 + kLanesMinRows <= m; r0 += kLaneRows) {
    const int64_t mg = std::min(kLaneRows, m - r0);
    PackRowLanes(a + r0 * lda, lda, mg, k, xpack);
    for (int64_t c0 = 0; c0 < n; c0 += kLaneCols) {
      DotLanesPacked(xpack, mg, b + c0 * ldb, ldb, std::min(kLaneCols, n - c0), k,
                     out + r0 * ldo + c0, ldo);
    }
  }
  if (r0 < m) DotTileHalves(a + r0 * lda, lda, m - r0, b, ldb, n, k, out + r0 * ldo, ldo);
}

// Every group of kLaneRows rows packed once (DotPacked then runs DotTileLanes' groups on them).
void PackRowGroups(const float* a, int64_t lda, int64_t m, int64_t k, PackedRows& rows) {
  const int64_t kp = (k + canon::kDotLanes - 1) / canon::kDotLanes;
  const int64_t group = kLaneRows / kLP * PanelStride(kp);
  const int64_t groups = m < kLanesMinRows ? 0 : (m - kLanesMinRows) / kLaneRows + 1;
  float* xpack = rows.storage.get(static_cast<size_t>(groups * group));
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t r0 = g * kLaneRows;
    PackRowLanes(a + r0 * lda, lda, std::min(kLaneRows, m - r0), k, xpack + g * group);
  }
  rows.packed = true;
}

void DotLanesOnPacked(const PackedRows& rows, const float* b, int64_t ldb, int64_t n, float* out,
                      int64_t ldo) {
  const int64_t kp = (rows.k + canon::kDotLanes - 1) / canon::kDotLanes;
  const int64_t group = kLaneRows / kLP * PanelStride(kp);
  const int64_t m = rows.m;
  int64_t r0 = 0;
  for (; r0 + kLanesMinRows <= m; r0 += kLaneRows) {
    const float* xpack = rows.storage.data() + r0 / kLaneRows * group;
    for (int64_t c0 = 0; c0 < n; c0 += kLaneCols) {
      DotLanesPacked(xpack, std::min(kLaneRows, m - r0), b + c0 * ldb, ldb,
                     std::min(kLaneCols, n - c0), rows.k, out + r0 * ldo + c0, ldo);
    }
  }
  if (r0 < m) {
    DotTileHalves(rows.a + r0 * rows.lda, rows.lda, m - r0, b, ldb, n, rows.k, out + r0 * ldo, ldo);
  }
}
#endif  // HWY_TARGET == HWY_AVX2

void DotTile(const float* a, int64_t lda, int64_t m, const float* b, int64_t ldb, int64_t n,
             int64_t k, float* out, int64_t ldo) {
  if constexpr (kKV == 2) {
#if HWY_TARGET == HWY_AVX2
    if (m >= kLanesMinRows && n >= kLanesMinCols && k >= kLanesMinK) {
      DotTileLanes(a, lda, m, b, ldb, n, k, out, ldo);
      return;
    }
#endif
    DotTileHalves(a, lda, m, b, ldb, n, k, out, ldo);
  } else {
    DotTileUnblocked(a, lda, m, b, ldb, n, k, out, ldo);
  }
}

// The rows of the op's row block, packed once for every tile when DotTile would take the lane
// GEMM for them.
void PackRows(const float* a, int64_t lda, int64_t m, int64_t k, PackedRows& rows) {
  record_rows(a, lda, m, k, rows);
#if HWY_TARGET == HWY_AVX2
  if (m >= kLanesMinRows && k >= kLanesMinK) PackRowGroups(a, lda, m, k, rows);
#endif
}

void DotPacked(const PackedRows& rows, const float* b, int64_t ldb, int64_t n, float* out,
               int64_t ldo) {
#if HWY_TARGET == HWY_AVX2
  if (rows.packed && n >= kLanesMinCols) {
    DotLanesOnPacked(rows, b, ldb, n, out, ldo);
    return;
  }
#endif
  DotTile(rows.a, rows.lda, rows.m, b, ldb, n, rows.k, out, ldo);
}

// MI outputs x kU vectors of one hidden block, chains over all nj: coefficient j of output i at
// coef[j * kMI + i] (packed), the block's v rows at v[j * kStep].
template <int MI>
HWY_INLINE void ChainBlock(const float* coef, int64_t nj, const float* v, float* y, int64_t ldy,
                           bool from_zero) {
  const DF d;
  VF acc[MI][kU];
  for (int i = 0; i < MI; ++i) {
    for (int u = 0; u < kU; ++u) {
      acc[i][u] = from_zero ? hn::Zero(d) : hn::LoadU(d, y + i * ldy + u * kN);
    }
  }
  for (int64_t j = 0; j < nj; ++j) {
    VF vv[kU];
    for (int u = 0; u < kU; ++u) vv[u] = hn::LoadU(d, v + j * kStep + u * kN);
    for (int i = 0; i < MI; ++i) {
      const VF c = hn::Set(d, coef[j * kMI + i]);
      for (int u = 0; u < kU; ++u) acc[i][u] = Fma(c, vv[u], acc[i][u]);
    }
  }
  for (int i = 0; i < MI; ++i) {
    for (int u = 0; u < kU; ++u) hn::StoreU(acc[i][u], d, y + i * ldy + u * kN);
  }
}

// The packed panels of one chunk of hidden blocks, at most this large: they stay in L2 while
// every output block runs over them.
constexpr int64_t kChunkPanelBytes = int64_t{256} << 10;

// The layout of the chains' values: hidden block b of v as a contiguous [nj, kStep] panel.
// The rows of v are usually a whole hidden size apart (16 KiB for H = 4096): read in place,
// every row of a block would land in the same L1 set.
struct ChainPanels {
  int64_t blocks;        // whole kStep blocks of the width (the rest: ChainTail)
  int64_t panel_floats;  // nj * kStep
  int64_t chunk;         // blocks per chunk: their panels stay in L2 together
};

ChainPanels ChainPanelsOf(int64_t nj, int64_t width) {
  const int64_t blocks = width / kStep;
  const int64_t panel_floats = std::max<int64_t>(nj, 1) * kStep;
  const int64_t chunk =
      std::clamp<int64_t>(kChunkPanelBytes / (panel_floats * static_cast<int64_t>(sizeof(float))),
                          1, std::max<int64_t>(blocks, 1));
  return {blocks, panel_floats, chunk};
}

// Panels of blocks [b0, b0 + nb) of v into dst (panel b - b0 at dst + (b - b0) * panel_floats),
// row by row of v (sequential reads the prefetcher follows).
void PackPanels(const float* v, int64_t ldv, int64_t nj, int64_t b0, int64_t nb,
                int64_t panel_floats, float* dst) {
  const DF d;
  for (int64_t j = 0; j < nj; ++j) {
    const float* src = v + j * ldv + b0 * kStep;
    for (int64_t b = 0; b < nb; ++b) {
      for (int u = 0; u < kU; ++u) {
        hn::Store(hn::LoadU(d, src + b * kStep + u * kN), d,
                  dst + b * panel_floats + j * kStep + u * kN);
      }
    }
  }
}

// The coefficients, once per call: each group of kMI outputs gets its [nj, kMI] panel, so a step
// reads its kMI coefficients from one line (strided reads in place cost an address register per
// output, more than AVX2's general registers hold). Thread-local; valid until the next call.
const float* PackCoefficients(const float* coef, int64_t ci, int64_t cj, int64_t ni, int64_t nj) {
  const int64_t groups = (ni + kMI - 1) / kMI;
  thread_local FloatBuffer scratch;
  float* panel = scratch.get(static_cast<size_t>(groups * nj * kMI));
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t mi = std::min<int64_t>(kMI, ni - g * kMI);
    float* dst = panel + g * nj * kMI;
    for (int64_t j = 0; j < nj; ++j) {
      for (int64_t i = 0; i < mi; ++i) dst[j * kMI + i] = coef[(g * kMI + i) * ci + j * cj];
    }
  }
  return panel;
}

// The chains of outputs [0, ni) over hidden blocks [b0, b0 + nb), whose panels are at panels +
// (b - b0) * panel_floats: each group of kMI outputs walks its rows of y along the blocks (a few
// sequential streams the prefetcher follows, where a block at a time over every output would
// touch each row of y once per block, a cache miss a hidden size away from the last).
// Each output element is still its own chain over j in order: the loop order changes no bit.
void ChainOverPanels(const float* coef_panel, int64_t ni, int64_t nj, const float* panels,
                     int64_t panel_floats, int64_t b0, int64_t nb, float* y, int64_t ldy,
                     bool from_zero) {
  for (int64_t g = 0; g < (ni + kMI - 1) / kMI; ++g) {
    const float* c = coef_panel + g * nj * kMI;
    const int64_t mi = std::min<int64_t>(kMI, ni - g * kMI);
    for (int64_t b = 0; b < nb; ++b) {
      const float* p = panels + b * panel_floats;
      float* out = y + g * kMI * ldy + (b0 + b) * kStep;
      if (mi == kMI) {
        ChainBlock<kMI>(c, nj, p, out, ldy, from_zero);
        continue;
      }
      int64_t i = 0;  // the last outputs: 4, 2, then 1 at a time (each still sharing its loads)
      for (; kMI > 4 && i + 4 <= mi; i += 4)
        ChainBlock<4>(c + i, nj, p, out + i * ldy, ldy, from_zero);
      for (; kMI > 2 && i + 2 <= mi; i += 2)
        ChainBlock<2>(c + i, nj, p, out + i * ldy, ldy, from_zero);
      for (; i < mi; ++i) ChainBlock<1>(c + i, nj, p, out + i * ldy, ldy, from_zero);
    }
  }
}

// The hidden elements [from, width) past the whole blocks: the same chains one element at a time.
void ChainTail(const float* coef, int64_t ci, int64_t cj, int64_t ni, int64_t nj, const float* v,
               int64_t ldv, int64_t from, int64_t width, float* y, int64_t ldy, bool from_zero) {
  for (int64_t i = 0; i < ni; ++i) {
    for (int64_t h = from; h < width; ++h) {
      float acc = from_zero ? 0.0f : y[i * ldy + h];
      for (int64_t j = 0; j < nj; ++j) {
        acc = canon::chain_step(coef[i * ci + j * cj], v[j * ldv + h], acc);
      }
      y[i * ldy + h] = acc;
    }
  }
}

// Packs a chunk of blocks at a time, then runs every output over it.
void Chain(const float* coef, int64_t ci, int64_t cj, int64_t ni, int64_t nj, const float* v,
           int64_t ldv, int64_t width, float* y, int64_t ldy, bool from_zero) {
  const ChainPanels cp = ChainPanelsOf(nj, width);
  const float* coef_panel = PackCoefficients(coef, ci, cj, ni, nj);
  thread_local FloatBuffer panel_scratch;
  float* panel = panel_scratch.get(static_cast<size_t>(cp.panel_floats * cp.chunk));
  for (int64_t b0 = 0; b0 < cp.blocks; b0 += cp.chunk) {
    const int64_t nb = std::min(cp.chunk, cp.blocks - b0);
    PackPanels(v, ldv, nj, b0, nb, cp.panel_floats, panel);
    ChainOverPanels(coef_panel, ni, nj, panel, cp.panel_floats, b0, nb, y, ldy, from_zero);
  }
  ChainTail(coef, ci, cj, ni, nj, v, ldv, cp.blocks * kStep, width, y, ldy, from_zero);
}

// Every block's panel packed once (the row block's hidden rows, read by every tile's chain).
void PackValues(const float* v, int64_t ldv, int64_t nj, int64_t width, PackedValues& values) {
  record_values(v, ldv, nj, width, values);
  const ChainPanels cp = ChainPanelsOf(nj, width);
  PackPanels(v, ldv, nj, 0, cp.blocks, cp.panel_floats,
             values.storage.get(static_cast<size_t>(cp.blocks * cp.panel_floats)));
  values.packed = true;
}

void ChainPacked(const float* coef, int64_t ci, int64_t cj, int64_t ni, const PackedValues& values,
                 float* y, int64_t ldy, bool from_zero) {
  const int64_t nj = values.nj;
  if (!values.packed) {
    Chain(coef, ci, cj, ni, nj, values.v, values.ldv, values.width, y, ldy, from_zero);
    return;
  }
  const ChainPanels cp = ChainPanelsOf(nj, values.width);
  const float* coef_panel = PackCoefficients(coef, ci, cj, ni, nj);
  for (int64_t b0 = 0; b0 < cp.blocks; b0 += cp.chunk) {  // chunks: y's rows walked in L2's span
    ChainOverPanels(coef_panel, ni, nj, values.storage.data() + b0 * cp.panel_floats,
                    cp.panel_floats, b0, std::min(cp.chunk, cp.blocks - b0), y, ldy, from_zero);
  }
  ChainTail(coef, ci, cj, ni, nj, values.v, values.ldv, cp.blocks * kStep, values.width, y, ldy,
            from_zero);
}

const DotOps* GetDotOps() {
  static const DotOps ops{.name = std::string("highway:") + hwy::TargetName(HWY_TARGET),
                          .native_fma = HWY_NATIVE_FMA != 0,
                          .dot_tile = &DotTile,
                          .chain = &Chain,
                          .pack_rows = &PackRows,
                          .dot_packed = &DotPacked,
                          .pack_values = &PackValues,
                          .chain_packed = &ChainPacked,
                          .dot_tile_unblocked = &DotTileUnblocked,
                          .dot_tile_halves = kKV == 2 ? &DotTileHalves : &DotTileUnblocked};
  return &ops;
}

#else  // HWY_TARGET == HWY_SCALAR: the single-lane fallback is the scalar reference itself.

const DotOps* GetDotOps() {
  static const DotOps ops = [] {
    DotOps o = reference_dot_ops();
    o.name = std::string("highway:") + hwy::TargetName(HWY_TARGET);
    return o;
  }();
  return &ops;
}

#endif  // HWY_TARGET != HWY_SCALAR

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace detlogp::fused
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/simd/dispatch_table.h"

namespace detlogp::fused {

HWY_EXPORT(GetDotOps);

namespace {

// The targets compiled in and supported by this CPU, best first (as the shard kernels read
// them).
std::vector<DotOps> collect_dot_ops() {
  std::vector<DotOps> result;
  simd::for_each_supported_target([&](int64_t target, std::size_t index) {
    const auto fn = HWY_DISPATCH_TABLE(GetDotOps)[index];
    if (fn == nullptr) return;
    const DotOps* ops = fn();
    if (ops->name != std::string("highway:") + hwy::TargetName(target)) return;
    result.push_back(*ops);
  });
  if (result.empty()) result.push_back(reference_dot_ops());
  return result;
}

}  // namespace

const std::vector<DotOps>& simd_dot_ops() {
  static const std::vector<DotOps> ops = collect_dot_ops();
  return ops;
}

}  // namespace detlogp::fused
#endif  // HWY_ONCE
