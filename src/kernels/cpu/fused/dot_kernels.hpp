#pragma once
// Internal interface of the fused lm_head's dense kernels: the canonical fp32 dot products that
// make logits, and the fma chains that make the two gradients (numerics/linear_canon.hpp).
// One implementation per Highway target (dot_targets.cpp) plus the scalar reference
// (dot_reference.cpp); every one returns the same bits, tested on every target this CPU has.
// All inputs are fp32 (bf16 and fp16 are widened exactly before they get here).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace detlogp::fused {

// out[i * ldo + j] = canonical_dot(a + i * lda, b + j * ldb, k) for i < m, j < n.
using DotTileFn = void (*)(const float* a, int64_t lda, int64_t m, const float* b, int64_t ldb,
                           int64_t n, int64_t k, float* out, int64_t ldo);

// For i < ni and h < width: acc = (from_zero ? +0 : y[i * ldy + h]); then for j = 0 .. nj-1 in
// order acc = fma(coef[i * ci + j * cj], v[j * ldv + h], acc); y[i * ldy + h] = acc.
// (Each output element is one scalar chain, so any vector width gives the same bits.)
using ChainFn = void (*)(const float* coef, int64_t ci, int64_t cj, int64_t ni, int64_t nj,
                         const float* v, int64_t ldv, int64_t width, float* y, int64_t ldy,
                         bool from_zero);

// Floats left uninitialised (every element is written before it is read: zero-filling would
// cost a pass over memory the kernel then overwrites), 64-byte aligned for whole-line vector
// loads; grown on demand and kept across uses (per thread, or per call).
class FloatBuffer {
 public:
  float* get(size_t n) {
    n = std::max<size_t>(n, 1);  // never null, even for an empty call
    if (n > size_) {
      data_.reset(new (std::align_val_t{kAlign}) float[n]);
      size_ = n;
    }
    return data_.get();
  }
  const float* data() const { return data_.get(); }

 private:
  static constexpr size_t kAlign = 64;
  struct Free {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t{kAlign}); }
  };
  std::unique_ptr<float[], Free> data_;
  size_t size_ = 0;
};

// A block of rows prepared once for the dot products of many tiles (the op's row block against
// each vocabulary tile). A kernel may pack them (AVX2's lane GEMM does, lane-major, so the
// packing is paid once per row block instead of once per tile), or only record where they are.
// The rows must stay unchanged while it is used.
struct PackedRows {
  const float* a = nullptr;  // row i at a + i * lda, k elements
  int64_t lda = 0;
  int64_t m = 0;
  int64_t k = 0;
  bool packed = false;  // storage holds the kernel's packed copy
  FloatBuffer storage;
};

// Records rows [0, m) of a (and packs them, for a kernel that does).
using PackRowsFn = void (*)(const float* a, int64_t lda, int64_t m, int64_t k, PackedRows& rows);
// dot_tile on prepared rows: out[i * ldo + j] = canonical_dot(row i, b + j * ldb, rows.k).
using DotPackedFn = void (*)(const PackedRows& rows, const float* b, int64_t ldb, int64_t n,
                             float* out, int64_t ldo);

// The PackRowsFn of a kernel that packs nothing.
inline void record_rows(const float* a, int64_t lda, int64_t m, int64_t k, PackedRows& rows) {
  rows.a = a;
  rows.lda = lda;
  rows.m = m;
  rows.k = k;
  rows.packed = false;
}

// The values v [nj, width] of chains prepared once for many outputs (the row block's hidden
// rows, for every tile's grad_weight chain): packed in the chain kernel's panels, or recorded.
// The values must stay unchanged while it is used.
struct PackedValues {
  const float* v = nullptr;  // value (j, h) at v[j * ldv + h]
  int64_t ldv = 0;
  int64_t nj = 0;
  int64_t width = 0;
  bool packed = false;  // storage holds the kernel's panels
  FloatBuffer storage;
};

// Records v (and packs it, for a kernel that does).
using PackValuesFn = void (*)(const float* v, int64_t ldv, int64_t nj, int64_t width,
                              PackedValues& values);
// chain on prepared values: ChainFn with nj, v, ldv and width from `values`.
using ChainPackedFn = void (*)(const float* coef, int64_t ci, int64_t cj, int64_t ni,
                               const PackedValues& values, float* y, int64_t ldy, bool from_zero);

// The PackValuesFn of a kernel that packs nothing.
inline void record_values(const float* v, int64_t ldv, int64_t nj, int64_t width,
                          PackedValues& values) {
  values.v = v;
  values.ldv = ldv;
  values.nj = nj;
  values.width = width;
  values.packed = false;
}

struct DotOps {
  std::string name;         // "scalar-reference" or "highway:<TARGET>"
  bool native_fma = false;  // false: fma emulated per lane (correct, slower)
  DotTileFn dot_tile = nullptr;
  ChainFn chain = nullptr;
  PackRowsFn pack_rows = nullptr;
  DotPackedFn dot_packed = nullptr;
  PackValuesFn pack_values = nullptr;
  ChainPackedFn chain_packed = nullptr;
  // The register-blocked tile without AVX2's lane GEMM (the AVX-512 and SSE4 choice): the same
  // bits, kept for the kernel benchmark's A/B and its bitwise test.
  DotTileFn dot_tile_unblocked = nullptr;
  // AVX2's tile before the lane GEMM (k blocked, the canon's lanes 0-7 and 8-15 as two halves;
  // dot_tile_unblocked elsewhere): the same bits, kept for the same A/B and test.
  DotTileFn dot_tile_halves = nullptr;
};

// The scalar reference: the canon's definitions, element by element.
const DotOps& reference_dot_ops();

// Every Highway target compiled in and supported by this CPU, best first.
const std::vector<DotOps>& simd_dot_ops();

}  // namespace detlogp::fused
