// The scalar reference of the fused lm_head's dense kernels: the canon's definitions, element
// by element (numerics/linear_canon.hpp). Slow and obviously right; the SIMD targets are tested
// bitwise against it.
#include "kernels/cpu/fused/dot_kernels.hpp"
#include "numerics/linear_canon.hpp"

namespace detlogp::fused {
namespace {

void reference_dot_tile(const float* a, int64_t lda, int64_t m, const float* b, int64_t ldb,
                        int64_t n, int64_t k, float* out, int64_t ldo) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j)
      out[i * ldo + j] = canon::canonical_dot(a + i * lda, b + j * ldb, k);
  }
}

void reference_chain(const float* coef, int64_t ci, int64_t cj, int64_t ni, int64_t nj,
                     const float* v, int64_t ldv, int64_t width, float* y, int64_t ldy,
                     bool from_zero) {
  for (int64_t i = 0; i < ni; ++i) {
    for (int64_t h = 0; h < width; ++h) {
      float acc = from_zero ? 0.0f : y[i * ldy + h];
      for (int64_t j = 0; j < nj; ++j)
        acc = canon::chain_step(coef[i * ci + j * cj], v[j * ldv + h], acc);
      y[i * ldy + h] = acc;
    }
  }
}

void reference_dot_packed(const PackedRows& rows, const float* b, int64_t ldb, int64_t n,
                          float* out, int64_t ldo) {
  reference_dot_tile(rows.a, rows.lda, rows.m, b, ldb, n, rows.k, out, ldo);
}

void reference_chain_packed(const float* coef, int64_t ci, int64_t cj, int64_t ni,
                            const PackedValues& values, float* y, int64_t ldy, bool from_zero) {
  reference_chain(coef, ci, cj, ni, values.nj, values.v, values.ldv, values.width, y, ldy,
                  from_zero);
}

}  // namespace

const DotOps& reference_dot_ops() {
  static const DotOps ops{.name = "scalar-reference",
                          .native_fma = true,
                          .dot_tile = &reference_dot_tile,
                          .chain = &reference_chain,
                          .pack_rows = &record_rows,
                          .dot_packed = &reference_dot_packed,
                          .pack_values = &record_values,
                          .chain_packed = &reference_chain_packed,
                          .dot_tile_unblocked = &reference_dot_tile,
                          .dot_tile_halves = &reference_dot_tile};
  return ops;
}

}  // namespace detlogp::fused
