// The fused lm_head's dense kernels on every SIMD target against the scalar canon: dot products
// (every hidden size around the 16-lane chunks, underflow to -0, NaN and inf) and the gradient
// chains (every width around the vector blocks, both coefficient layouts, continuing chains).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "detlogp/kernels.hpp"
#include "kernels/cpu/fused/dot_kernels.hpp"
#include "numerics/linear_canon.hpp"

namespace detlogp::fused {
namespace {

std::vector<float> random_values(std::size_t n, uint32_t salt) {
  std::mt19937 gen(salt);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

std::vector<const DotOps*> every_kernel() {
  std::vector<const DotOps*> k{&reference_dot_ops()};
  for (const DotOps& ops : simd_dot_ops()) k.push_back(&ops);
  return k;
}

uint32_t bits(float f) { return canon::bits_of(f); }

TEST(FusedDotKernels, DotTilesMatchTheScalarCanonOnEveryTarget) {
  for (int64_t k = 1; k <= 70; ++k) {
    const int64_t m = 5, n = 7;
    std::vector<float> a = random_values(static_cast<std::size_t>(m * k), 1 + k);
    std::vector<float> b = random_values(static_cast<std::size_t>(n * k), 100 + k);
    if (k == 33) {  // special values in some rows and columns
      a[0] = std::numeric_limits<float>::quiet_NaN();
      b[k] = std::numeric_limits<float>::infinity();
      b[2 * k + 1] = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < k; ++j) {  // row 3: products that underflow to -0
        a[3 * k + j] = -1e-30f;
        b[4 * k + j] = 1e-30f;
      }
    }
    for (const DotOps* ops : every_kernel()) {
      std::vector<float> out(static_cast<std::size_t>(m * n));
      ops->dot_tile(a.data(), k, m, b.data(), k, n, k, out.data(), n);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const float want = canon::canonical_dot(a.data() + i * k, b.data() + j * k, k);
          ASSERT_EQ(bits(want), bits(out[i * n + j]))
              << ops->name << " k=" << k << " (" << i << ", " << j << ")";
        }
      }
    }
  }
}

TEST(FusedDotKernels, LongStridedDotTilesMatchTheScalarCanonOnEveryTarget) {
  // Hidden sizes of several hundred elements, rows further apart than k and an output stride
  // wider than the tile (as inside the op), tiles whose sides are not multiples of any register
  // block, and one row whose products all underflow to -0 over the whole length.
  // AVX2 runs k in chunks of 256 and rows in groups of 16: shapes on and around both.
  const int64_t shapes[][3] = {{1, 1, 255},    {6, 5, 256},   {4, 9, 257},
                               {33, 130, 300}, {7, 3, 511},   {2, 17, 784},
                               {9, 4, 1029},   {16, 12, 512}, {17, 7, 768}};
  for (const auto& [m, n, k] : shapes) {
    const int64_t lda = k + 3, ldb = k + 11, ldo = n + 2;
    std::vector<float> a = random_values(static_cast<std::size_t>(m * lda), 7 + k);
    std::vector<float> b = random_values(static_cast<std::size_t>(n * ldb), 300 + k);
    for (int64_t j = 0; j < k; ++j) {
      a[(m - 1) * lda + j] = -1e-30f;
      b[(n - 1) * ldb + j] = 1e-30f;
    }
    for (const DotOps* ops : every_kernel()) {
      for (DotTileFn tile : {ops->dot_tile, ops->dot_tile_unblocked, ops->dot_tile_halves}) {
        std::vector<float> out(static_cast<std::size_t>(m * ldo));
        tile(a.data(), lda, m, b.data(), ldb, n, k, out.data(), ldo);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            const float want = canon::canonical_dot(a.data() + i * lda, b.data() + j * ldb, k);
            ASSERT_EQ(bits(want), bits(out[i * ldo + j]))
                << ops->name
                << (tile == ops->dot_tile             ? ""
                    : tile == ops->dot_tile_unblocked ? " unblocked"
                                                      : " halves")
                << " m=" << m << " n=" << n << " k=" << k << " (" << i << ", " << j << ")";
          }
        }
      }
    }
  }
}

TEST(FusedDotKernels, LaneGemmTilesMatchTheScalarCanonOnEveryTarget) {
  // Tiles of at least 24 rows, 64 columns and 512 elements (AVX2 runs them as one matrix
  // product per canon lane: hidden rows packed lane-major in panels of 16 rows, weight rows
  // packed lane-major in blocks of 6, each lane's whole chains in registers, rows in groups of
  // 96 and a last group under 24 rows on the previous tile; other targets run rows in groups of
  // 32): rows around the panels and groups, columns around the blocks of 6 and the 128-column
  // groups, k around the 16-element chunks, and special values: NaN, +-inf, products that
  // underflow to -0 over a whole row, -0 inputs.
  const int64_t shapes[][3] = {{24, 64, 512},  {25, 65, 513},  {29, 71, 527},   {31, 64, 2049},
                               {32, 128, 512}, {33, 70, 4100}, {47, 100, 1000}, {56, 97, 600},
                               {30, 66, 1039}, {96, 128, 520}, {97, 131, 512},  {119, 64, 600},
                               {121, 70, 1030}};
  for (const auto& [m, n, k] : shapes) {
    const int64_t lda = k + 5, ldb = k + 3, ldo = n + 1;
    std::vector<float> a = random_values(static_cast<std::size_t>(m * lda), 11 + k + m);
    std::vector<float> b = random_values(static_cast<std::size_t>(n * ldb), 500 + k + n);
    for (int64_t j = 0; j < k; ++j) {  // last row and column: every product underflows to -0
      a[(m - 1) * lda + j] = -1e-30f;
      b[(n - 1) * ldb + j] = 1e-30f;
    }
    a[1 * lda + k - 1] = std::numeric_limits<float>::quiet_NaN();  // in the last chunk
    a[2 * lda + 3] = -0.0f;
    b[2 * ldb + 17] = std::numeric_limits<float>::infinity();
    b[3 * ldb + k / 2] = -std::numeric_limits<float>::infinity();
    b[(n - 2) * ldb] = -0.0f;
    for (const DotOps* ops : every_kernel()) {
      std::vector<float> out(static_cast<std::size_t>(m * ldo), 7.0f);
      ops->dot_tile(a.data(), lda, m, b.data(), ldb, n, k, out.data(), ldo);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const float want = canon::canonical_dot(a.data() + i * lda, b.data() + j * ldb, k);
          ASSERT_EQ(bits(want), bits(out[i * ldo + j]))
              << ops->name << " m=" << m << " n=" << n << " k=" << k << " (" << i << ", " << j
              << ")";
        }
        ASSERT_EQ(out[i * ldo + n], 7.0f) << ops->name << " wrote past the tile";
      }
    }
  }
}

TEST(FusedDotKernels, RowsPackedOnceGiveEveryTilesBitsOnEveryTarget) {
  // The op packs a row block's hidden rows once (pack_rows) and runs every vocabulary tile on
  // them (dot_packed): rows in one, two and three lane groups with and without a last group
  // under 24 rows, tiles wide and narrow (under 64 columns the tile runs without the packing),
  // k under and over the lane GEMM's 512, special values; several tiles on one packing.
  const int64_t shapes[][3] = {{5, 70, 600},     {24, 64, 512},  {96, 128, 520}, {100, 10, 530},
                               {121, 130, 1030}, {200, 70, 513}, {216, 64, 600}, {40, 80, 300}};
  for (const auto& [m, n, k] : shapes) {
    const int64_t lda = k + 5, ldb = k + 3, ldo = n + 1;
    const int64_t tiles = 3;  // tile t: rows [t, t + n) of b
    std::vector<float> a = random_values(static_cast<std::size_t>(m * lda), 21 + k + m);
    std::vector<float> b = random_values(static_cast<std::size_t>((n + tiles) * ldb), 600 + n);
    for (int64_t j = 0; j < k; ++j) a[(m - 1) * lda + j] = -1e-30f, b[j] = 1e-30f;
    a[k - 1] = std::numeric_limits<float>::quiet_NaN();
    b[2 * ldb + 17] = std::numeric_limits<float>::infinity();
    for (const DotOps* ops : every_kernel()) {
      PackedRows rows;
      ops->pack_rows(a.data(), lda, m, k, rows);
      for (int64_t t = 0; t < tiles; ++t) {
        std::vector<float> out(static_cast<std::size_t>(m * ldo), 7.0f);
        ops->dot_packed(rows, b.data() + t * ldb, ldb, n, out.data(), ldo);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            const float want =
                canon::canonical_dot(a.data() + i * lda, b.data() + (t + j) * ldb, k);
            ASSERT_EQ(bits(want), bits(out[i * ldo + j]))
                << ops->name << " m=" << m << " n=" << n << " k=" << k << " tile " << t << " (" << i
                << ", " << j << ")";
          }
          ASSERT_EQ(out[i * ldo + n], 7.0f) << ops->name << " wrote past the tile";
        }
      }
    }
  }
}

TEST(FusedDotKernels, LargeStridedChainsMatchTheScalarCanonOnEveryTarget) {
  // Chains over many values of a wide hidden size (values [nj, width] of 140 x 1030 floats,
  // 564 KiB: more than a SIMD kernel packs at once) and over a few (a row block's tokens), with
  // rows of v, coef and y further apart than their widths, both coefficient layouts.
  const int64_t shapes[][3] = {{9, 140, 1030}, {130, 7, 1030}};  // ni, nj, width
  for (const auto& [ni, nj, width] : shapes) {
    const int64_t ldv = width + 5, ldy = width + 3;
    const std::vector<float> coef = random_values(static_cast<std::size_t>(ni * nj), 17);
    const std::vector<float> v = random_values(static_cast<std::size_t>(nj * ldv), 18);
    const std::vector<float> y0 = random_values(static_cast<std::size_t>(ni * ldy), 19);
    for (bool transposed : {false, true}) {
      const int64_t ci = transposed ? 1 : nj;
      const int64_t cj = transposed ? ni : 1;
      for (const DotOps* ops : every_kernel()) {
        std::vector<float> got = y0;
        ops->chain(coef.data(), ci, cj, ni, nj, v.data(), ldv, width, got.data(), ldy, false);
        for (int64_t i = 0; i < ni; ++i) {
          for (int64_t h = 0; h < width; ++h) {
            float acc = y0[i * ldy + h];
            for (int64_t j = 0; j < nj; ++j) {
              acc = canon::chain_step(coef[i * ci + j * cj], v[j * ldv + h], acc);
            }
            ASSERT_EQ(bits(acc), bits(got[i * ldy + h]))
                << ops->name << " ni=" << ni << " nj=" << nj << " (" << i << ", " << h << ")";
          }
        }
      }
    }
  }
}

TEST(FusedDotKernels, ValuesPackedOnceGiveEveryChainsBitsOnEveryTarget) {
  // The backward packs a row block's hidden rows once (pack_values) for every tile's grad_weight
  // chain (chain_packed): values in one chunk and in several with a short last one, widths with
  // a tail past the vector blocks, few and many outputs, both coefficient layouts, chains from
  // +0 and continued; two coefficient sets on one packing.
  const int64_t shapes[][3] = {{9, 140, 1030}, {130, 7, 1030}, {13, 96, 4099}, {6, 3, 20}};
  for (const auto& [ni, nj, width] : shapes) {
    const int64_t ldv = width + 5, ldy = width + 3;
    const std::vector<float> v = random_values(static_cast<std::size_t>(nj * ldv), 28);
    const std::vector<float> y0 = random_values(static_cast<std::size_t>(ni * ldy), 29);
    for (const DotOps* ops : every_kernel()) {
      PackedValues values;
      ops->pack_values(v.data(), ldv, nj, width, values);
      for (int set = 0; set < 2; ++set) {
        const bool transposed = set == 1, from_zero = set == 0;
        const std::vector<float> coef = random_values(static_cast<std::size_t>(ni * nj), 30 + set);
        const int64_t ci = transposed ? 1 : nj;
        const int64_t cj = transposed ? ni : 1;
        std::vector<float> got = y0;
        ops->chain_packed(coef.data(), ci, cj, ni, values, got.data(), ldy, from_zero);
        for (int64_t i = 0; i < ni; ++i) {
          for (int64_t h = 0; h < width; ++h) {
            float acc = from_zero ? 0.0f : y0[i * ldy + h];
            for (int64_t j = 0; j < nj; ++j) {
              acc = canon::chain_step(coef[i * ci + j * cj], v[j * ldv + h], acc);
            }
            ASSERT_EQ(bits(acc), bits(got[i * ldy + h]))
                << ops->name << " ni=" << ni << " nj=" << nj << " width=" << width << " set " << set
                << " (" << i << ", " << h << ")";
          }
          for (int64_t h = width; h < ldy; ++h) {  // past the width: untouched
            ASSERT_EQ(bits(y0[i * ldy + h]), bits(got[i * ldy + h])) << ops->name;
          }
        }
      }
    }
  }
}

TEST(FusedDotKernels, UnderflowingProductsKeepTheCanonsSignedZero) {
  // Every product is -1e-60 in exact arithmetic: each lane's fma rounds to -0, and the canon's
  // padding (k = 20 -> 32) turns lanes 4..15 back to +0 before the fold.
  const int64_t k = 20;
  std::vector<float> a(k, -1e-30f), b(k, 1e-30f);
  for (const DotOps* ops : every_kernel()) {
    float out = 1.0f;
    ops->dot_tile(a.data(), k, 1, b.data(), k, 1, k, &out, 1);
    EXPECT_EQ(bits(out), bits(canon::canonical_dot(a.data(), b.data(), k))) << ops->name;
  }
}

TEST(FusedDotKernels, ChainsMatchTheScalarCanonOnEveryTarget) {
  for (int64_t width : {1, 7, 8, 15, 16, 17, 31, 32, 33, 64, 257, 300}) {
    const int64_t ni = 6, nj = 9;
    const std::vector<float> coef = random_values(static_cast<std::size_t>(ni * nj), 7);
    const std::vector<float> v = random_values(static_cast<std::size_t>(nj * width), 8);
    const std::vector<float> y0 = random_values(static_cast<std::size_t>(ni * width), 9);
    for (bool from_zero : {true, false}) {
      for (bool transposed : {false, true}) {
        const int64_t ci = transposed ? 1 : nj;
        const int64_t cj = transposed ? ni : 1;
        std::vector<float> want = y0;
        reference_dot_ops().chain(coef.data(), ci, cj, ni, nj, v.data(), width, width, want.data(),
                                  width, from_zero);
        for (int64_t i = 0; i < ni; ++i) {  // the definition, element by element
          for (int64_t h = 0; h < width; ++h) {
            float acc = from_zero ? 0.0f : y0[i * width + h];
            for (int64_t j = 0; j < nj; ++j)
              acc = std::fma(coef[i * ci + j * cj], v[j * width + h], acc);
            ASSERT_EQ(bits(acc), bits(want[i * width + h]));
          }
        }
        for (const DotOps* ops : every_kernel()) {
          std::vector<float> got = y0;
          ops->chain(coef.data(), ci, cj, ni, nj, v.data(), width, width, got.data(), width,
                     from_zero);
          for (std::size_t e = 0; e < got.size(); ++e) {
            ASSERT_EQ(bits(want[e]), bits(got[e])) << ops->name << " width=" << width << " e=" << e;
          }
        }
      }
    }
  }
}

TEST(FusedDotKernels, EveryTargetOfThisCpuIsListedAndNamed) {
  ASSERT_FALSE(simd_dot_ops().empty());
  for (const DotOps& ops : simd_dot_ops()) {
    EXPECT_EQ(ops.name.rfind("highway:", 0), 0u) << ops.name;
    EXPECT_EQ(fused_kernels_for(ops.name).name(), ops.name);
    EXPECT_EQ(fused_kernels_for(ops.name.substr(8)).name(), ops.name);  // without "highway:"
    EXPECT_EQ(&fused_kernels_for(ops.name).shard_kernels(), &simd_kernels());
  }
  EXPECT_EQ(fused_kernels_for("").name(), simd_dot_ops().front().name);
  EXPECT_EQ(fused_kernels_for("scalar-reference").name(), reference_dot_ops().name);
  EXPECT_EQ(&fused_kernels_for("scalar-reference").shard_kernels(), &reference_kernels());
}

}  // namespace
}  // namespace detlogp::fused
