// The Highway SIMD kernels against the scalar reference, bitwise (raw bit patterns), on random
// and adversarial inputs; thread counts and batch positions never change a bit.
//
// Per-target tests are instances of the SimdTarget suite, one per SIMD target this CPU has
// (forced through simd_kernels_for) and named after it: SimdTarget.BackwardMatchesReference/AVX2.
// A failure names its target; --gtest_filter='*/AVX2' runs one target.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "detlogp/kernels.hpp"
#include "kernels/cpu/simd/simd_kernels.hpp"
#include "numerics/canon.hpp"

namespace detlogp {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint32_t bits(float f) { return canon::bits_of(f); }

// ---------------------------------------------------------------------------------------------
// Logit matrices in any dtype.

struct Matrix {
  DType dtype = DType::fp32;
  int64_t rows = 0, cols = 0, stride = 0;
  std::vector<uint8_t> bytes;

  LogitsView view() const { return LogitsView{bytes.data(), dtype, rows, cols, stride}; }
};

// Stores fp32 values narrowed to `dtype` (round to nearest even; the test only needs some
// deterministic narrowing). Columns [cols, stride) hold garbage that must never be read.
Matrix make_matrix(const std::vector<float>& values, int64_t rows, int64_t cols, int64_t stride,
                   DType dtype) {
  Matrix m;
  m.dtype = dtype;
  m.rows = rows;
  m.cols = cols;
  m.stride = stride;
  const size_t es = dtype_size(dtype);
  m.bytes.assign(static_cast<size_t>(rows * stride) * es, 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < stride; ++c) {
      const float v = c < cols ? values[static_cast<size_t>(r * cols + c)] : kNaN;
      uint8_t* at = m.bytes.data() + static_cast<size_t>(r * stride + c) * es;
      if (dtype == DType::fp32) {
        std::memcpy(at, &v, 4);
      } else {
        const uint16_t h = dtype == DType::bf16 ? canon::float_to_bf16(v) : canon::float_to_fp16(v);
        std::memcpy(at, &h, 2);
      }
    }
  }
  return m;
}

// Row kinds that stress every special case of the canon.
std::vector<float> adversarial_values(int64_t rows, int64_t cols, int64_t real_cols,
                                      uint64_t stream) {
  std::mt19937_64 rng(stream);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int64_t> col(0, std::max<int64_t>(real_cols - 1, 0));
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    float* row = v.data() + r * cols;
    const int kind = static_cast<int>(r % 16);
    const float scale = std::vector<float>{1.0f, 3.0f, 30.0f, 1e4f}[static_cast<size_t>(r % 4)];
    for (int64_t c = 0; c < cols; ++c) row[c] = normal(rng) * scale;
    switch (kind) {
      case 0:
      case 1:
        break;  // plain random
      case 2:   // -inf sprinkled in real columns, and whole -inf runs
        for (int64_t c = 0; c < cols; ++c) {
          if (rng() % 5 == 0 || (c / 37) % 3 == 1) row[c] = -kInf;
        }
        break;
      case 3: {  // only the target is finite
        for (int64_t c = 0; c < cols; ++c) row[c] = -kInf;
        row[col(rng)] = 2.5f;
        break;
      }
      case 4:  // constant row (ties everywhere)
        for (int64_t c = 0; c < cols; ++c) row[c] = 7.25f;
        break;
      case 5:  // subnormals, zeros of both signs
        for (int64_t c = 0; c < cols; ++c) {
          const uint32_t u = static_cast<uint32_t>(rng() % 0x800000u) | ((rng() & 1) << 31);
          row[c] = rng() % 3 == 0 ? (rng() & 1 ? -0.0f : 0.0f) : canon::float_of(u);
        }
        break;
      case 6:  // all -0.0
        for (int64_t c = 0; c < cols; ++c) row[c] = -0.0f;
        break;
      case 7:  // a huge negative floor with a few large values
        for (int64_t c = 0; c < cols; ++c) row[c] = rng() % 7 == 0 ? 1e4f * normal(rng) : -1e30f;
        break;
      case 8:  // one NaN
        row[col(rng)] = kNaN;
        break;
      case 9:  // one +inf
        row[col(rng)] = kInf;
        break;
      case 10:  // all -inf
        for (int64_t c = 0; c < cols; ++c) row[c] = -kInf;
        break;
      case 11:  // a NaN hidden among -inf
        for (int64_t c = 0; c < cols; ++c) row[c] = -kInf;
        row[col(rng)] = kNaN;
        break;
      case 12:  // wide range: values near the exp flush threshold relative to the max
        for (int64_t c = 0; c < cols; ++c) row[c] = -87.5f + 0.37f * normal(rng);
        row[col(rng)] = 0.5f;
        break;
      case 13:  // -1e30 everywhere but for a few ties at the max
        for (int64_t c = 0; c < cols; ++c) row[c] = rng() % 11 == 0 ? 3.0f : -1e30f;
        break;
      case 14:  // fp32 extremes (overflow with temperature < 1)
        for (int64_t c = 0; c < cols; ++c) row[c] = normal(rng) * 3e38f;
        break;
      default:  // small integers: many exact ties
        for (int64_t c = 0; c < cols; ++c) row[c] = static_cast<float>(rng() % 5);
        break;
    }
    // Padding columns hold garbage that must be ignored.
    for (int64_t c = real_cols; c < cols; ++c) {
      row[c] = (c % 3 == 0) ? kNaN : (c % 3 == 1 ? kInf : 1e30f);
    }
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// Bitwise comparison.

::testing::AssertionResult same_partials(const std::vector<NodePartial>& want,
                                         const std::vector<NodePartial>& got) {
  if (want.size() != got.size()) return ::testing::AssertionFailure() << "size differs";
  for (size_t i = 0; i < want.size(); ++i) {
    const NodePartial& a = want[i];
    const NodePartial& b = got[i];
    if (bits(a.m) != bits(b.m) || bits(a.s) != bits(b.s) || bits(a.u) != bits(b.u)) {
      return ::testing::AssertionFailure()
             << "partial " << i << ": reference (" << a.m << ", " << a.s << ", " << a.u
             << ") bits (" << std::hex << bits(a.m) << ", " << bits(a.s) << ", " << bits(a.u)
             << ") vs simd (" << std::dec << b.m << ", " << b.s << ", " << b.u << ") bits ("
             << std::hex << bits(b.m) << ", " << bits(b.s) << ", " << bits(b.u) << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_floats(const std::vector<float>& want,
                                       const std::vector<float>& got, const char* what) {
  if (want.size() != got.size()) return ::testing::AssertionFailure() << what << ": size differs";
  for (size_t i = 0; i < want.size(); ++i) {
    if (bits(want[i]) != bits(got[i])) {
      return ::testing::AssertionFailure()
             << what << "[" << i << "]: reference " << want[i] << " (" << std::hex << bits(want[i])
             << ") vs simd " << std::dec << got[i] << " (" << std::hex << bits(got[i]) << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_bytes(const std::vector<uint8_t>& want,
                                      const std::vector<uint8_t>& got, size_t elem) {
  if (want.size() != got.size()) return ::testing::AssertionFailure() << "size differs";
  for (size_t i = 0; i < want.size(); i += elem) {
    if (std::memcmp(want.data() + i, got.data() + i, elem) != 0) {
      uint32_t a = 0, b = 0;
      std::memcpy(&a, want.data() + i, elem);
      std::memcpy(&b, got.data() + i, elem);
      return ::testing::AssertionFailure() << "gradient element " << i / elem << ": reference "
                                           << std::hex << a << " vs simd " << b;
    }
  }
  return ::testing::AssertionSuccess();
}

class SimdTarget : public ::testing::TestWithParam<std::string> {
 protected:
  const ShardKernels& kernels() const { return simd_kernels_for(GetParam()); }
  // The target's row functions, for tests that call them directly.
  simd::TargetOps ops() const {
    for (const simd::TargetOps& o : simd::supported_target_ops()) {
      if (GetParam() == o.name) return o;
    }
    ADD_FAILURE() << "target " << GetParam() << " has no row functions";
    return {};
  }
};

INSTANTIATE_TEST_SUITE_P(, SimdTarget, ::testing::ValuesIn(simd_targets()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// ---------------------------------------------------------------------------------------------
// Forward: node partials and roots.

// One shard at vocab_start 0 as the forward and backward cases build it: adversarial logits
// with `pad` garbage columns after each row, the spec, and the canonical cover of all its tiles.
struct CaseShard {
  Matrix m;
  ShardSpec spec;
  std::vector<TreeNode> cover;
};

CaseShard case_shard(DType dtype, int64_t tile_width, int64_t real_vocab, int64_t cols,
                     int64_t rows, float temperature, uint64_t stream, int64_t pad,
                     float softcap = 0.0f) {
  CaseShard s;
  const std::vector<float> values = adversarial_values(rows, cols, real_vocab, stream);
  s.m = make_matrix(values, rows, cols, cols + pad, dtype);
  s.spec.geometry = TileGeometry{real_vocab, tile_width};
  s.spec.temperature = temperature;
  s.spec.softcap = softcap;
  const int64_t tiles = (cols + tile_width - 1) / tile_width;
  s.cover = canonical_cover(s.spec.geometry, 0, tiles);
  return s;
}

struct ForwardCase {
  DType dtype;
  int64_t tile_width;
  int64_t real_vocab;
  int64_t cols;  // padded shard width (one shard at vocab_start 0) unless split
  int64_t rows;
  float temperature;
  uint64_t stream;
  float softcap = 0.0f;  // 0: none
};

std::vector<NodePartial> partials_of(const ShardKernels& k, const LogitsView& v,
                                     const ShardSpec& spec, const std::vector<TreeNode>& nodes,
                                     bool entropy, int threads = 2) {
  std::vector<NodePartial> out(static_cast<size_t>(v.rows) * nodes.size(),
                               NodePartial{1.0f, 2.0f, 3.0f});
  k.node_partials(v, spec, nodes, entropy, out, ExecOptions{threads});
  return out;
}

void check_forward(const ForwardCase& fc, const ShardKernels& k) {
  SCOPED_TRACE("dtype " + std::to_string(static_cast<int>(fc.dtype)) + " W " +
               std::to_string(fc.tile_width) + " R " + std::to_string(fc.real_vocab) + " cols " +
               std::to_string(fc.cols) + " tau " + std::to_string(fc.temperature) + " cap " +
               std::to_string(fc.softcap));
  const CaseShard shard = case_shard(fc.dtype, fc.tile_width, fc.real_vocab, fc.cols, fc.rows,
                                     fc.temperature, fc.stream, 5, fc.softcap);
  const Matrix& m = shard.m;
  const ShardSpec& spec = shard.spec;
  const std::vector<TreeNode>& cover = shard.cover;
  // Every leaf too, and every level's first node (nodes partly beyond T).
  std::vector<TreeNode> many = cover;
  const int64_t real_tiles = spec.geometry.num_real_tiles();
  for (int64_t t = 0; t < real_tiles; ++t) many.push_back(TreeNode{0, t});
  for (int l = 1; l <= spec.geometry.tree_levels(); ++l) many.push_back(TreeNode{l, 0});
  const ShardKernels& ref = reference_kernels();
  for (bool entropy : {false, true}) {
    SCOPED_TRACE(entropy ? "with entropy" : "without entropy");
    const std::vector<NodePartial> want = partials_of(ref, m.view(), spec, many, entropy);
    std::vector<float> want_lse(static_cast<size_t>(fc.rows)), want_h(want_lse.size());
    const std::vector<NodePartial> want_cover = partials_of(ref, m.view(), spec, cover, entropy);
    ref.merge_roots(spec.geometry, cover, want_cover, fc.rows,
                    RootsOut{want_lse, entropy ? std::span<float>(want_h) : std::span<float>()});
    EXPECT_TRUE(same_partials(want, partials_of(k, m.view(), spec, many, entropy)));
    std::vector<float> lse(want_lse.size()), h(want_h.size());
    const std::vector<NodePartial> got_cover = partials_of(k, m.view(), spec, cover, entropy);
    k.merge_roots(spec.geometry, cover, got_cover, fc.rows,
                  RootsOut{lse, entropy ? std::span<float>(h) : std::span<float>()});
    EXPECT_TRUE(same_floats(want_lse, lse, "lse"));
    if (entropy) {
      EXPECT_TRUE(same_floats(want_h, h, "entropy"));
    }
  }
}

TEST(SimdKernels, TargetsAreListedAndSelectable) {
  const std::vector<std::string> t = simd_targets();
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(simd_kernels().name(), "highway:" + t.front());
  for (const std::string& name : t) EXPECT_EQ(simd_kernels_for(name).name(), "highway:" + name);
  EXPECT_THROW(simd_kernels_for("NOT_A_TARGET"), std::runtime_error);
  // Each entry really is that target's code.
  for (const simd::TargetOps& ops : simd::supported_target_ops()) {
    EXPECT_EQ(std::string(hwy::TargetName(ops.target)), ops.name);
  }
}

TEST_P(SimdTarget, DetExpMatchesCanon) {
  std::vector<float> x;
  // Dense strided sample of [-87, 0] (every 1021st float), then the edges and specials.
  for (uint32_t u = canon::bits_of(-0.0f); u <= canon::bits_of(-87.0f); u += 1021) {
    x.push_back(canon::float_of(u));
  }
  for (float v : {0.0f,   -0.0f,  1e-45f,      -1e-45f,      -87.0f, -87.3f, -87.33654f,
                  -87.5f, -88.0f, -88.00001f,  -100.0f,      -1e30f, -kInf,  kInf,
                  kNaN,   1.0f,   10.0f,       88.0f,        88.7f,  88.8f,  88.80001f,
                  89.0f,  1e30f,  0.34657359f, -0.34657359f, 0.5f,   -0.5f}) {
    x.push_back(v);
  }
  for (uint32_t u = canon::bits_of(-87.0f); u <= canon::bits_of(-89.0f); u += 7) {
    x.push_back(canon::float_of(u));
  }
  for (uint32_t u = canon::bits_of(0.0f); u <= canon::bits_of(88.9f); u += 4099) {
    x.push_back(canon::float_of(u));
  }
  std::vector<float> y(x.size());
  ops().det_exp_array(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = canon::det_exp(x[i]);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(y[i])) << "x = " << x[i];
    } else {
      ASSERT_EQ(bits(want), bits(y[i])) << "x = " << x[i] << " (" << std::hex << bits(x[i]) << ")";
    }
  }
}

// The target's vector det_tanh against the canon's: a strided sample of every fp32 bit pattern
// (both signs, subnormals, the polynomial's threshold, saturation, infinities, NaNs), and every
// float around the vector form's clamp.
TEST_P(SimdTarget, DetTanhMatchesCanon) {
  std::vector<float> x;
  for (uint64_t u = 0; u <= 0xffffffffu; u += 4093) x.push_back(canon::float_of(uint32_t(u)));
  for (uint32_t u = canon::bits_of(0.5f); u <= canon::bits_of(0.625f); u += 61) {
    x.push_back(canon::float_of(u));
    x.push_back(-canon::float_of(u));
  }
  // Every float of |x| in [9.5, 10.5]: where the vector form clamps det_exp's argument -2|x| at
  // -20 (r = 1 exactly on both sides of it).
  for (uint32_t u = canon::bits_of(9.5f); u <= canon::bits_of(10.5f); ++u) {
    x.push_back(canon::float_of(u));
    x.push_back(-canon::float_of(u));
  }
  for (float v : {0.0f, -0.0f, 1e-45f, -1e-45f, 0.5625f, -0.5625f, 0.56249994f, 9.0f, 9.02f, 44.0f,
                  44.5f, 1e30f, -1e30f, kInf, -kInf, kNaN}) {
    x.push_back(v);
  }
  std::vector<float> y(x.size());
  ops().det_tanh_array(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = canon::det_tanh(x[i]);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(y[i])) << "x = " << x[i];
    } else {
      ASSERT_EQ(bits(want), bits(y[i])) << "x = " << x[i] << " (" << std::hex << bits(x[i]) << ")";
    }
  }
}

// Forward with a logit softcap (with and without a temperature), on the adversarial rows
// (inf, NaN, huge and tied logits): the capped leaves and roots of the reference, bit for bit.
TEST_P(SimdTarget, SoftcapForwardMatchesReference) {
  for (DType dt : {DType::fp32, DType::bf16, DType::fp16}) {
    check_forward({dt, 128, 1000, 1024, 32, 1.0f, 61, 30.0f}, kernels());
    check_forward({dt, 48, 997, 1056, 32, 0.7f, 62, 5.0f}, kernels());
    check_forward({dt, 4, 301, 304, 32, 1.0f, 63, 0.75f}, kernels());
    check_forward({dt, 128, 7, 128, 16, 1.3f, 64, 50.0f}, kernels());
    // Whole lane groups only (no padded tail) and 2 cap / tau > 80: the leaf's flushing pass.
    check_forward({dt, 64, 1024, 1024, 16, 0.5f, 65, 30.0f}, kernels());
  }
}

TEST_P(SimdTarget, ForwardMatchesReferenceAdversarial) {
  // W in {4, 48, 128, 2376}; R not a multiple of 32 or of W; partly padding tiles.
  for (DType dt : {DType::fp32, DType::bf16, DType::fp16}) {
    check_forward({dt, 128, 1000, 1024, 32, 1.0f, 1}, kernels());
    check_forward({dt, 48, 997, 1056, 32, 0.7f, 2}, kernels());
    check_forward({dt, 4, 301, 304, 32, 1.0f, 3}, kernels());
    check_forward({dt, 2376, 5000, 7128, 16, 1.0f, 4}, kernels());
    check_forward({dt, 128, 128 * 9, 128 * 9, 16, 1.3f, 5}, kernels());
    check_forward({dt, 128, 7, 128, 16, 1.0f, 6}, kernels());
  }
}

// TP-style splits: node partials of each shard's canonical cover, concatenated, give the same
// roots as the reference (and the reference's own single-shard roots).
TEST_P(SimdTarget, ShardCoversMatchReference) {
  const int64_t W = 16, R = 16 * 37 + 5, padded = 16 * 40, rows = 24;
  const std::vector<float> values = adversarial_values(rows, padded, R, 11);
  for (DType dt : {DType::fp32, DType::bf16}) {
    const Matrix full = make_matrix(values, rows, padded, padded, dt);
    const size_t es = dtype_size(dt);
    for (const std::vector<int64_t>& cuts : std::vector<std::vector<int64_t>>{
             {0, 40}, {0, 20, 40}, {0, 3, 17, 30, 40}, {0, 5, 10, 15, 20, 25, 30, 35, 40}}) {
      for (bool entropy : {false, true}) {
        std::vector<TreeNode> all_nodes;
        std::vector<std::vector<NodePartial>> parts_ref, parts_simd;
        for (size_t s = 0; s + 1 < cuts.size(); ++s) {
          const int64_t a = cuts[s], b = cuts[s + 1];
          LogitsView v{full.bytes.data() + static_cast<size_t>(a * W) * es, dt, rows, (b - a) * W,
                       padded};
          ShardSpec spec;
          spec.vocab_start = a * W;
          spec.geometry = TileGeometry{R, W};
          const std::vector<TreeNode> cover = canonical_cover(spec.geometry, a, b);
          all_nodes.insert(all_nodes.end(), cover.begin(), cover.end());
          parts_ref.push_back(partials_of(reference_kernels(), v, spec, cover, entropy));
          parts_simd.push_back(partials_of(kernels(), v, spec, cover, entropy));
          EXPECT_TRUE(same_partials(parts_ref.back(), parts_simd.back()));
        }
        // Row-major gather: partials[row * nodes + j].
        auto gather = [&](const std::vector<std::vector<NodePartial>>& parts) {
          std::vector<NodePartial> g;
          for (int64_t r = 0; r < rows; ++r) {
            for (const auto& p : parts) {
              const size_t n = p.size() / static_cast<size_t>(rows);
              g.insert(g.end(), p.begin() + static_cast<std::ptrdiff_t>(r * n),
                       p.begin() + static_cast<std::ptrdiff_t>((r + 1) * n));
            }
          }
          return g;
        };
        std::vector<float> lse_ref(rows), h_ref(rows), lse(rows), h(rows);
        const TileGeometry geo{R, W};
        reference_kernels().merge_roots(geo, all_nodes, gather(parts_ref), rows,
                                        RootsOut{lse_ref, h_ref});
        kernels().merge_roots(geo, all_nodes, gather(parts_simd), rows, RootsOut{lse, h});
        EXPECT_TRUE(same_floats(lse_ref, lse, "lse"));
        EXPECT_TRUE(same_floats(h_ref, h, "entropy"));
      }
    }
  }
}

// Every fp16 bit pattern as a logit (exercises the widening of subnormals, infinities, NaNs).
TEST_P(SimdTarget, EveryFp16PatternMatchesReference) {
  const int64_t rows = 64, cols = 1024;
  Matrix m;
  m.dtype = DType::fp16;
  m.rows = rows;
  m.cols = cols;
  m.stride = cols;
  m.bytes.resize(static_cast<size_t>(rows * cols) * 2);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    std::memcpy(m.bytes.data() + i * 2, &h, 2);
  }
  ShardSpec spec;
  spec.geometry = TileGeometry{cols, 32};
  // Column-wise tiles of 32 patterns each: most tiles are finite, some hold inf/NaN.
  const std::vector<TreeNode> nodes = [&] {
    std::vector<TreeNode> n;
    for (int64_t t = 0; t < cols / 32; ++t) n.push_back(TreeNode{0, t});
    return n;
  }();
  const auto want = partials_of(reference_kernels(), m.view(), spec, nodes, true);
  EXPECT_TRUE(same_partials(want, partials_of(kernels(), m.view(), spec, nodes, true)));
}

// ---------------------------------------------------------------------------------------------
// Backward.

struct BackwardCase {
  DType dtype;
  int64_t tile_width, real_vocab, cols, rows;
  float temperature;
  bool logp, lse, entropy;  // which incoming gradients are supplied
  float grad_scale;
  uint64_t stream;
  float softcap = 0.0f;  // 0: none
};

std::vector<uint8_t> run_backward(const ShardKernels& k, const Matrix& m, const ShardSpec& spec,
                                  const BackwardInputs& in, int64_t grad_stride, int threads) {
  const size_t es = dtype_size(m.dtype);
  std::vector<uint8_t> g(static_cast<size_t>(m.rows * grad_stride) * es, 0xab);
  MutableLogitsView gv{g.data(), m.dtype, m.rows, m.cols, grad_stride};
  k.backward(m.view(), spec, in, gv, ExecOptions{threads});
  return g;
}

void check_backward(const BackwardCase& bc, const ShardKernels& k) {
  SCOPED_TRACE("dtype " + std::to_string(static_cast<int>(bc.dtype)) + " W " +
               std::to_string(bc.tile_width) + " R " + std::to_string(bc.real_vocab) + " tau " +
               std::to_string(bc.temperature) + " grads " + std::to_string(bc.logp) +
               std::to_string(bc.lse) + std::to_string(bc.entropy) + " cap " +
               std::to_string(bc.softcap));
  const CaseShard shard = case_shard(bc.dtype, bc.tile_width, bc.real_vocab, bc.cols, bc.rows,
                                     bc.temperature, bc.stream, 3, bc.softcap);
  const Matrix& m = shard.m;
  const ShardSpec& spec = shard.spec;
  const std::vector<TreeNode>& cover = shard.cover;
  // Roots from the reference forward; a few rows get arbitrary non-finite roots.
  const auto parts = partials_of(reference_kernels(), m.view(), spec, cover, true);
  std::vector<float> lse(static_cast<size_t>(bc.rows)), h(lse.size());
  reference_kernels().merge_roots(spec.geometry, cover, parts, bc.rows, RootsOut{lse, h});
  std::mt19937_64 rng(bc.stream + 100);
  std::normal_distribution<float> normal(0.0f, bc.grad_scale);
  std::vector<int64_t> target(lse.size());
  std::vector<float> g_logp(lse.size()), g_lse(lse.size()), g_h(lse.size());
  const int64_t real_cols = std::min(bc.real_vocab, bc.cols);
  for (size_t r = 0; r < lse.size(); ++r) {
    target[r] = (r % 5 == 4 || real_cols == 0) ? -1 : static_cast<int64_t>(rng() % real_cols);
    g_logp[r] = target[r] < 0 && r % 2 == 0 ? 0.0f : normal(rng);
    g_lse[r] = r % 7 == 3 ? 0.0f : normal(rng);
    g_h[r] = normal(rng);
    if (r % 23 == 5) lse[r] = -kInf;
    if (r % 29 == 6) lse[r] = kNaN;
    if (r % 31 == 7) lse[r] = kInf;
  }
  BackwardInputs in;
  in.lse = lse;
  in.entropy = h;
  in.target_local = target;
  if (bc.logp) in.grad_logp = g_logp;
  if (bc.lse) in.grad_lse = g_lse;
  if (bc.entropy) in.grad_entropy = g_h;
  const int64_t grad_stride = bc.cols + 7;
  const auto want = run_backward(reference_kernels(), m, spec, in, grad_stride, 1);
  const auto got = run_backward(k, m, spec, in, grad_stride, 2);
  EXPECT_TRUE(same_bytes(want, got, dtype_size(bc.dtype)));
}

TEST_P(SimdTarget, BackwardMatchesReference) {
  for (DType dt : {DType::fp32, DType::bf16, DType::fp16}) {
    for (int mask = 0; mask < 8; ++mask) {
      const bool a = mask & 1, b = mask & 2, c = mask & 4;
      check_backward({dt, 128, 1000, 1024, 48, 1.0f, a, b, c, 1.0f, 20u + mask}, kernels());
    }
    check_backward({dt, 48, 997, 1056, 32, 0.7f, true, true, true, 1.0f, 31}, kernels());
    check_backward({dt, 4, 301, 304, 32, 1.0f, true, false, true, 1.0f, 32}, kernels());
    // Gradients across the fp16/bf16 range: overflow to inf, subnormal results.
    check_backward({dt, 128, 500, 512, 32, 1.0f, true, true, true, 1e5f, 33}, kernels());
    check_backward({dt, 128, 500, 512, 32, 1.0f, true, true, true, 1e-6f, 34}, kernels());
    check_backward({dt, 128, 500, 512, 32, 2.5f, true, true, true, 3e4f, 35}, kernels());
  }
}

// Backward with a logit softcap: the slope times the canon's gradient of the capped z, every
// supplied-gradient combination, non-finite roots, gradients large enough to overflow.
TEST_P(SimdTarget, SoftcapBackwardMatchesReference) {
  for (DType dt : {DType::fp32, DType::bf16, DType::fp16}) {
    for (int mask = 1; mask < 8; ++mask) {
      const bool a = mask & 1, b = mask & 2, c = mask & 4;
      check_backward({dt, 128, 1000, 1024, 48, 1.0f, a, b, c, 1.0f, 70u + mask, 30.0f}, kernels());
    }
    check_backward({dt, 48, 997, 1056, 32, 0.7f, true, true, true, 1.0f, 81, 5.0f}, kernels());
    check_backward({dt, 4, 301, 304, 32, 1.0f, true, false, true, 1.0f, 82, 0.75f}, kernels());
    check_backward({dt, 128, 500, 512, 32, 2.5f, true, true, true, 3e38f, 83, 30.0f}, kernels());
  }
}

// The non-temporal store path (outputs of 32 MiB and more), with rows whose gradient does not
// start on a vector boundary.
TEST_P(SimdTarget, LargeBackwardMatchesReference) {
  const std::vector<std::string> best = simd_targets();
  if (GetParam() != best[0] && (best.size() < 2 || GetParam() != best[1])) {
    GTEST_SKIP() << "the large case runs on the two best targets (" << best[0]
                 << (best.size() > 1 ? ", " + best[1] : std::string()) << ") only; the small "
                 << "cases of BackwardMatchesReference cover " << GetParam();
  }
  check_backward({DType::fp32, 128, 151936 - 3, 152064 - 64, 56, 1.0f, true, true, true, 1.0f, 40},
                 kernels());
}

// Roots and coefficients that the forward never produces, aimed at the backward's fast path
// (x = z - LSE in [-86, -0], no flush, no NaN select): LSE below the row max (x > 0), LSE equal
// to a logit (x = +0) or +0 against z = -0, x near -86, H = -x (a zero bracket), H = +-0,
// non-finite or huge H, and gradients that are NaN, infinite, +-0, tiny or large enough for
// t1 + t2 or t3 to overflow.
TEST_P(SimdTarget, BackwardArbitraryRootsAndCoefficientsMatchReference) {
  const int64_t R = 250, cols = 256, rows = 96, stride = cols + 5;
  std::mt19937_64 rng(90);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (float& v : values) v = normal(rng);
  std::vector<float> lse(rows), h(rows), g(rows), gl(rows), gh(rows);
  std::vector<int64_t> target(rows);
  const float specials[] = {0.0f,  -0.0f, kNaN,   kInf,    -kInf,  3e38f, -3e38f,
                            1e38f, 2e38f, 1e-30f, -1e-38f, 1e-45f, 0.75f, -1.25f};
  const size_t ns = sizeof specials / sizeof specials[0];
  for (int64_t r = 0; r < rows; ++r) {
    float* row = values.data() + r * cols;
    if (r % 6 == 1) {  // zeros of both signs among values around 0
      for (int64_t c = 0; c < cols; ++c) row[c] = c % 3 == 0 ? (c % 2 ? -0.0f : 0.0f) : row[c];
    }
    if (r % 6 == 2) {  // a band around the fast path's limit x = -86
      for (int64_t c = 0; c < cols; ++c) row[c] = -86.0f + 0.01f * normal(rng);
    }
    float mx = -kInf;
    for (int64_t c = 0; c < R; ++c) mx = std::max(mx, row[c]);
    const size_t i = static_cast<size_t>(r);
    switch (r % 8) {
      case 0:
        lse[i] = mx + 2.0f;
        break;
      case 1:
        lse[i] = r % 6 == 1 ? 0.0f : mx;
        break;  // x = +0 (and -0 - +0 = -0)
      case 2:
        lse[i] = row[r % R];
        break;  // x = +0 at one column, x > 0 beyond
      case 3:
        lse[i] = mx - 0.5f;
        break;
      case 4:
        lse[i] = r % 6 == 2 ? 0.0f : mx + 80.0f;
        break;
      case 5:
        lse[i] = mx + 86.0f;
        break;
      case 6:
        lse[i] = -0.0f;
        break;
      default:
        lse[i] = mx + 1e-3f;
        break;
    }
    // H: the negated x of some column (a bracket of exactly 0), +-0, specials, plain values.
    switch (r % 5) {
      case 0:
        h[i] = -(row[(r * 7) % R] - lse[i]);
        break;
      case 1:
        h[i] = specials[(r / 5) % ns];
        break;
      case 2:
        h[i] = r % 2 ? 0.0f : -0.0f;
        break;
      default:
        h[i] = normal(rng);
        break;
    }
    g[i] = r % 3 == 0 ? specials[(r * 5) % ns] : normal(rng);
    gl[i] = r % 4 == 1 ? specials[(r * 3) % ns] : normal(rng);
    gh[i] = r % 7 == 2 ? specials[r % ns] : normal(rng);
    if (r % 11 == 3) {  // t1 + t2 overflows to -inf, t3 to +inf: NaN
      g[i] = 3e38f;
      gl[i] = -3e38f;
      gh[i] = 3e38f;
      h[i] = -1e38f;
    }
    target[i] = r % 4 == 3 ? -1 : (r * 37) % R;
  }
  for (DType dt : {DType::fp32, DType::bf16, DType::fp16}) {
    const Matrix m = make_matrix(values, rows, cols, stride, dt);
    for (float tau : {1.0f, 0.7f}) {
      ShardSpec spec;
      spec.geometry = TileGeometry{R, 128};
      spec.temperature = tau;
      for (int mask = 0; mask < 8; ++mask) {
        SCOPED_TRACE("dtype " + std::to_string(static_cast<int>(dt)) + " tau " +
                     std::to_string(tau) + " mask " + std::to_string(mask));
        BackwardInputs in;
        in.lse = lse;
        in.entropy = h;
        in.target_local = target;
        if (mask & 1) in.grad_logp = g;
        if (mask & 2) in.grad_lse = gl;
        if (mask & 4) in.grad_entropy = gh;
        const auto want = run_backward(reference_kernels(), m, spec, in, cols + 3, 1);
        const auto got = run_backward(kernels(), m, spec, in, cols + 3, 2);
        EXPECT_TRUE(same_bytes(want, got, dtype_size(dt)));
      }
    }
  }
}

// The non-temporal store path of each target's backward row function, forced on small inputs
// (the driver only enables it for large outputs), rows starting at every alignment.
TEST_P(SimdTarget, StreamingStoresMatchReference) {
  const int64_t R = 1000, cols = 1024, rows = 24, stride = cols + 1;  // odd stride: all offsets
  const std::vector<float> values = adversarial_values(rows, cols, R, 70);
  for (DType dt : {DType::fp32, DType::bf16, DType::fp16}) {
    const Matrix m = make_matrix(values, rows, cols, cols, dt);
    ShardSpec spec;
    spec.geometry = TileGeometry{R, 128};
    std::vector<float> lse(rows, 4.0f), h(rows, 1.5f), g(rows, 0.75f), gl(rows, -0.5f),
        gh(rows, 0.25f);
    std::vector<int64_t> target(rows);
    for (int64_t r = 0; r < rows; ++r) target[static_cast<size_t>(r)] = (r * 41) % R;
    BackwardInputs in{lse, h, target, g, gl, gh};
    const auto want = run_backward(reference_kernels(), m, spec, in, stride, 1);
    {
      const size_t es = dtype_size(dt);
      std::vector<uint8_t> got(static_cast<size_t>(rows * stride) * es, 0xab);
      simd::BackwardJob job;
      job.data = m.bytes.data();
      job.dtype = dt;
      job.row_stride = cols;
      job.cols = cols;
      job.geometry = spec.geometry;
      job.lse = lse.data();
      job.entropy = h.data();
      job.target_local = target.data();
      job.grad_logp = g.data();
      job.grad_lse = gl.data();
      job.grad_entropy = gh.data();
      job.grad = got.data();
      job.grad_row_stride = stride;
      job.stream_stores = true;
      ops().backward_rows(job, 0, rows);
      EXPECT_TRUE(same_bytes(want, got, es));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Threads and batches.

TEST(SimdKernels, ThreadCountsAndBatchPositionsDoNotChangeBits) {
  const int64_t W = 128, R = 2000, cols = 2048;
  const int64_t rows = 1000;
  const std::vector<float> values = adversarial_values(rows, cols, R, 50);
  ShardSpec spec;
  spec.geometry = TileGeometry{R, W};
  const std::vector<TreeNode> cover = canonical_cover(spec.geometry, 0, cols / W);
  for (DType dt : {DType::bf16, DType::fp32}) {
    const Matrix m = make_matrix(values, rows, cols, cols, dt);
    const auto base = partials_of(simd_kernels(), m.view(), spec, cover, true, 1);
    for (int threads : {2, 4, 7}) {
      EXPECT_TRUE(
          same_partials(base, partials_of(simd_kernels(), m.view(), spec, cover, true, threads)));
    }
    // One row alone vs inside batches of 1, 7, 64 and 1000 rows at different positions.
    const size_t nn = cover.size();
    for (int64_t row : {int64_t{0}, int64_t{3}, int64_t{517}, int64_t{999}}) {
      for (int64_t batch : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{1000}}) {
        const int64_t start = std::max<int64_t>(0, std::min(row - batch / 2, rows - batch));
        LogitsView v = m.view();
        v.data = m.bytes.data() + static_cast<size_t>(start * cols) * dtype_size(dt);
        v.rows = batch;
        const auto got = partials_of(simd_kernels(), v, spec, cover, true, 4);
        const int64_t pos = row - start;
        if (pos < 0 || pos >= batch) continue;
        for (size_t j = 0; j < nn; ++j) {
          const NodePartial& a = base[static_cast<size_t>(row) * nn + j];
          const NodePartial& b = got[static_cast<size_t>(pos) * nn + j];
          ASSERT_EQ(bits(a.m), bits(b.m));
          ASSERT_EQ(bits(a.s), bits(b.s));
          ASSERT_EQ(bits(a.u), bits(b.u));
        }
      }
    }
    // Backward with 1, 2 and 4 threads.
    std::vector<float> lse(rows), h(rows);
    simd_kernels().merge_roots(spec.geometry, cover, base, rows, RootsOut{lse, h});
    std::vector<int64_t> target(rows);
    std::vector<float> g(rows, 0.5f), gl(rows, -0.25f), gh(rows, 0.125f);
    for (int64_t r = 0; r < rows; ++r) target[static_cast<size_t>(r)] = (r * 37) % R;
    BackwardInputs in{lse, h, target, g, gl, gh};
    const auto g1 = run_backward(simd_kernels(), m, spec, in, cols, 1);
    for (int threads : {2, 4}) {
      EXPECT_TRUE(
          same_bytes(g1, run_backward(simd_kernels(), m, spec, in, cols, threads), dtype_size(dt)));
    }
  }
}

// bf16 and fp16 inputs equal their exact fp32 upcast, bitwise.
TEST_P(SimdTarget, HalfInputsEqualTheirFp32Upcast) {
  const int64_t rows = 32, cols = 1024, R = 1000;
  const std::vector<float> values = adversarial_values(rows, cols, R, 60);
  ShardSpec spec;
  spec.geometry = TileGeometry{R, 128};
  const std::vector<TreeNode> cover = canonical_cover(spec.geometry, 0, cols / 128);
  for (DType dt : {DType::bf16, DType::fp16}) {
    const Matrix half = make_matrix(values, rows, cols, cols, dt);
    std::vector<float> up(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < up.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, half.bytes.data() + i * 2, 2);
      up[i] = dt == DType::bf16 ? canon::bf16_to_float(h) : canon::fp16_to_float(h);
    }
    const Matrix full = make_matrix(up, rows, cols, cols, DType::fp32);
    EXPECT_TRUE(same_partials(partials_of(kernels(), full.view(), spec, cover, true),
                              partials_of(kernels(), half.view(), spec, cover, true)));
  }
}

}  // namespace
}  // namespace detlogp
