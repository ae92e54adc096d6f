// Bitwise invariances of the scalar reference kernels (numerics.md "What must be tested
// bitwise"): TP cuts, padded sizes, dtype upcasts, temperature, batch composition. Every
// comparison is on raw bit patterns.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "detlogp/kernels.hpp"
#include "numerics/canon.hpp"
#include "testing/logits_gen.hpp"
#include "testing/shard_pipeline.hpp"

namespace detlogp {
namespace {

using testing::bits;
using testing::ForwardResult;
using testing::GradInputs;
using testing::Logits;
using testing::RowKind;

const ShardKernels& ref() { return reference_kernels(); }

void expect_same_bits(std::span<const float> a, std::span<const float> b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(bits(a[i]), bits(b[i])) << what << "[" << i << "]: " << a[i] << " vs " << b[i];
  }
}

void expect_same_forward(const ForwardResult& a, const ForwardResult& b) {
  expect_same_bits(a.lse, b.lse, "lse");
  expect_same_bits(a.entropy, b.entropy, "entropy");
  expect_same_bits(a.logp, b.logp, "logp");
  expect_same_bits(a.target_z, b.target_z, "target_z");
}

// Gradients compared over columns [0, cols) of both buffers.
void expect_same_grad(const Logits& a, const Logits& b, int64_t cols) {
  ASSERT_EQ(a.rows, b.rows);
  for (int64_t r = 0; r < a.rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(a.raw(r, c), b.raw(r, c)) << "grad[" << r << ", " << c << "]";
    }
  }
}

// How the kernels store the fp32 gradient value v in `dtype`: narrowed to bf16 or fp16, or
// canonicalized in fp32.
uint32_t stored_bits(DType dtype, float v) {
  if (dtype == DType::bf16) return canon::float_to_bf16(v);
  if (dtype == DType::fp16) return canon::float_to_fp16(v);
  return bits(canon::canonicalize(v));
}

// Every element (r, c), c < cols, of `got` holds stored_bits(got.dtype, want(r, c)).
template <class Want>
void expect_grad_stored(const Logits& got, int64_t cols, Want want) {
  for (int64_t r = 0; r < got.rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(got.raw(r, c), stored_bits(got.dtype, want(r, c)))
          << "grad[" << r << ", " << c << "]";
    }
  }
}

GradInputs random_grads(int64_t rows, std::span<const int64_t> targets, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  GradInputs g;
  for (int64_t r = 0; r < rows; ++r) {
    g.grad_logp.push_back(targets[static_cast<size_t>(r)] >= 0 ? u(rng) : 0.0f);
    g.grad_lse.push_back(u(rng));
    g.grad_entropy.push_back(u(rng));
  }
  return g;
}

// Every other row inactive (target -1).
std::vector<int64_t> with_inactive(std::vector<int64_t> targets) {
  for (size_t r = 1; r < targets.size(); r += 3) targets[r] = -1;
  return targets;
}

// The root of each row computed as the single tree node (K, 0) over the whole matrix.
void whole_tree_roots(const Logits& x, const TileGeometry& g, float tau, std::vector<float>* lse,
                      std::vector<float>* entropy) {
  const TreeNode root{g.tree_levels(), 0};
  std::vector<NodePartial> p(static_cast<size_t>(x.rows));
  ref().node_partials(x.view(), ShardSpec{0, g, tau}, std::span(&root, 1), true, p);
  lse->clear();
  entropy->clear();
  for (const NodePartial& n : p) {
    const canon::RootValues v = canon::finish_root(canon::Partial{n.m, n.s, n.u});
    lse->push_back(v.lse);
    entropy->push_back(v.entropy);
  }
}

struct Shape {
  int64_t real, padded, width, rows;
};

TEST(ReferenceInvariance, TpCutsGiveTheSameBits) {
  std::mt19937_64 rng(1);
  const std::vector<RowKind> kinds = testing::all_row_kinds();
  for (const Shape& s :
       {Shape{151936, 152064, 128, 2}, Shape{1000, 1056, 48, 16}, Shape{1003, 1003, 4, 16},
        Shape{777, 800, 32, 16}, Shape{130, 256, 128, 16}}) {
    const TileGeometry g{s.real, s.width};
    for (DType dtype : {DType::fp32, DType::bf16, DType::fp16}) {
      SCOPED_TRACE(::testing::Message() << "R=" << s.real << " padded=" << s.padded << " W="
                                        << s.width << " dtype=" << static_cast<int>(dtype));
      std::vector<int64_t> targets;
      const Logits x = testing::make_logits(dtype, s.rows, s.padded, s.real, kinds, rng, &targets);
      targets = with_inactive(targets);
      const GradInputs grads = random_grads(s.rows, targets, rng);
      const std::vector<int64_t> one{0, (s.padded + s.width - 1) / s.width};
      const ForwardResult base = testing::forward_sharded(ref(), x, g, one, 1.0f, true, targets);
      const Logits base_grad =
          testing::backward_sharded(ref(), x, g, one, 1.0f, targets, base, grads);
      std::vector<float> lse, entropy;
      whole_tree_roots(x, g, 1.0f, &lse, &entropy);
      expect_same_bits(base.lse, lse, "lse vs whole-tree node");
      expect_same_bits(base.entropy, entropy, "entropy vs whole-tree node");
      for (int tp = 2; tp <= 8; ++tp) {
        for (int trial = 0; trial < (s.real > 100000 ? 1 : 3); ++trial) {
          const bool even = trial == 0;
          const std::vector<int64_t> cuts = testing::make_cuts(s.padded, s.width, tp, even, rng);
          SCOPED_TRACE(::testing::Message() << "tp=" << tp << (even ? " even" : " uneven"));
          const ForwardResult f = testing::forward_sharded(ref(), x, g, cuts, 1.0f, true, targets);
          expect_same_forward(base, f);
          const Logits grad = testing::backward_sharded(ref(), x, g, cuts, 1.0f, targets, f, grads);
          expect_same_grad(base_grad, grad, x.cols);
        }
      }
    }
  }
}

TEST(ReferenceInvariance, PaddedSizeDoesNotMatter) {
  // Qwen3: real vocab 151936, padded to 128 * TP by Megatron at TP = 1, 2, 4 / 8, 16.
  std::mt19937_64 rng(2);
  const int64_t real = 151936;
  const TileGeometry g{real, 128};
  const std::vector<RowKind> kinds{RowKind::normal, RowKind::neg_inf_mixed, RowKind::wide};
  std::vector<int64_t> targets;
  const Logits base_x = testing::make_logits(DType::bf16, 3, real, real, kinds, rng, &targets);
  const GradInputs grads = random_grads(3, targets, rng);
  ForwardResult first;
  Logits first_grad;
  bool have_first = false;
  for (int64_t padded : {int64_t{151936}, int64_t{152064}, int64_t{152576}}) {
    Logits x(DType::bf16, 3, padded);
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t c = 0; c < real; ++c) x.set_raw(r, c, base_x.raw(r, c));
    }
    testing::fill_padding_garbage(x, real);  // 1e4, NaN, +-inf, 3e38...
    for (int tp : {1, 2, 4, 8}) {
      SCOPED_TRACE(::testing::Message() << "padded=" << padded << " tp=" << tp);
      const std::vector<int64_t> cuts = testing::make_cuts(padded, 128, tp, true, rng);
      const ForwardResult f = testing::forward_sharded(ref(), x, g, cuts, 1.0f, true, targets);
      const Logits grad = testing::backward_sharded(ref(), x, g, cuts, 1.0f, targets, f, grads);
      for (int64_t r = 0; r < 3; ++r) {
        for (int64_t c = real; c < padded; ++c) {
          ASSERT_EQ(grad.raw(r, c), 0u) << c;
        }
      }
      if (!have_first) {
        first = f;
        first_grad = grad;
        have_first = true;
        for (float v : f.lse) EXPECT_TRUE(std::isfinite(v));
        continue;
      }
      expect_same_forward(first, f);
      expect_same_grad(first_grad, grad, real);
    }
  }
}

// bf16 / fp16 inputs equal their exact fp32 upcasts: node partials (leaves and internal nodes),
// roots, and the gradient narrowed from the fp32 gradient.
TEST(ReferenceInvariance, HalfInputsEqualTheirFp32Upcast) {
  std::mt19937_64 rng(3);
  const std::vector<RowKind> kinds = testing::all_row_kinds();
  for (const Shape& s :
       {Shape{1000, 1024, 128, 32}, Shape{1001, 1008, 48, 32}, Shape{37, 40, 4, 32}}) {
    const TileGeometry g{s.real, s.width};
    for (DType dtype : {DType::bf16, DType::fp16}) {
      for (float tau : {1.0f, 0.7f}) {
        SCOPED_TRACE(::testing::Message() << "R=" << s.real << " W=" << s.width << " dtype="
                                          << static_cast<int>(dtype) << " tau=" << tau);
        std::vector<int64_t> targets;
        const Logits x =
            testing::make_logits(dtype, s.rows, s.padded, s.real, kinds, rng, &targets);
        const Logits x32 = testing::to_fp32(x);
        // Every node of the tree: leaves, internal nodes, root.
        std::vector<TreeNode> nodes;
        for (int level = 0; level <= g.tree_levels(); ++level) {
          for (int64_t i = 0; (i << level) < g.num_real_tiles(); ++i) nodes.push_back({level, i});
        }
        for (bool with_entropy : {false, true}) {
          std::vector<NodePartial> a(static_cast<size_t>(s.rows) * nodes.size());
          std::vector<NodePartial> b(a.size());
          ref().node_partials(x.view(), ShardSpec{0, g, tau}, nodes, with_entropy, a);
          ref().node_partials(x32.view(), ShardSpec{0, g, tau}, nodes, with_entropy, b);
          for (size_t i = 0; i < a.size(); ++i) {
            ASSERT_EQ(bits(a[i].m), bits(b[i].m)) << i;
            ASSERT_EQ(bits(a[i].s), bits(b[i].s)) << i;
            ASSERT_EQ(bits(a[i].u), bits(b[i].u)) << i;
          }
        }
        const std::vector<int64_t> cuts = testing::make_cuts(s.padded, s.width, 3, false, rng);
        const ForwardResult f = testing::forward_sharded(ref(), x, g, cuts, tau, true, targets);
        const ForwardResult f32 = testing::forward_sharded(ref(), x32, g, cuts, tau, true, targets);
        expect_same_forward(f, f32);
        const GradInputs grads = random_grads(s.rows, targets, rng);
        const Logits gh = testing::backward_sharded(ref(), x, g, cuts, tau, targets, f, grads);
        const Logits g32 = testing::backward_sharded(ref(), x32, g, cuts, tau, targets, f32, grads);
        ASSERT_NO_FATAL_FAILURE(
            expect_grad_stored(gh, s.padded, [&](int64_t r, int64_t c) { return g32.get(r, c); }));
      }
    }
  }
}

// x with temperature tau equals the pre-divided fp32 input z = fp32(x) / tau with tau = 1;
// the gradient with tau is the tau = 1 gradient (in fp32) divided by tau, then narrowed.
TEST(ReferenceInvariance, TemperatureEqualsPreDividedInput) {
  std::mt19937_64 rng(4);
  const std::vector<RowKind> kinds = testing::all_row_kinds();
  const Shape s{1000, 1024, 128, 32};
  const TileGeometry g{s.real, s.width};
  for (DType dtype : {DType::fp32, DType::bf16, DType::fp16}) {
    for (float tau : {0.3f, 0.7f, 1.3f, 2.0f}) {
      SCOPED_TRACE(::testing::Message() << "dtype=" << static_cast<int>(dtype) << " tau=" << tau);
      std::vector<int64_t> targets;
      const Logits x = testing::make_logits(dtype, s.rows, s.padded, s.real, kinds, rng, &targets);
      Logits z(DType::fp32, s.rows, s.padded);
      for (int64_t r = 0; r < s.rows; ++r) {
        for (int64_t c = 0; c < s.padded; ++c) z.set(r, c, x.get(r, c) / tau);
      }
      const std::vector<int64_t> cuts = testing::make_cuts(s.padded, s.width, 2, false, rng);
      const ForwardResult fx = testing::forward_sharded(ref(), x, g, cuts, tau, true, targets);
      const ForwardResult fz = testing::forward_sharded(ref(), z, g, cuts, 1.0f, true, targets);
      expect_same_forward(fx, fz);
      const GradInputs grads = random_grads(s.rows, targets, rng);
      const Logits gx = testing::backward_sharded(ref(), x, g, cuts, tau, targets, fx, grads);
      const Logits gz = testing::backward_sharded(ref(), z, g, cuts, 1.0f, targets, fz, grads);
      // padding: +0 / tau = +0
      ASSERT_NO_FATAL_FAILURE(expect_grad_stored(
          gx, s.padded, [&](int64_t r, int64_t c) { return gz.get(r, c) / tau; }));
    }
  }
}

// A row alone equals the same row inside batches of 1, 7 and 64 rows at different positions,
// in views whose row_stride exceeds cols, through TP = 1 and an uneven TP = 3 cut.
TEST(ReferenceInvariance, RowAloneEqualsRowInBatch) {
  std::mt19937_64 rng(5);
  const std::vector<RowKind> kinds = testing::all_row_kinds();
  const Shape s{1001, 1056, 48, 64};
  const TileGeometry g{s.real, s.width};
  for (DType dtype : {DType::fp32, DType::bf16}) {
    std::vector<int64_t> targets;
    const Logits pool = testing::make_logits(dtype, s.rows, s.padded, s.real, kinds, rng, &targets);
    targets = with_inactive(targets);
    const GradInputs grads = random_grads(s.rows, targets, rng);
    for (const std::vector<int64_t>& cuts :
         {std::vector<int64_t>{0, 22}, testing::make_cuts(s.padded, s.width, 3, false, rng)}) {
      // Each row alone (batch of 1, stride == cols).
      std::vector<ForwardResult> alone;
      std::vector<Logits> alone_grad;
      for (int64_t r = 0; r < s.rows; ++r) {
        const Logits x = testing::copy_rows(pool, r, 1);
        const std::vector<int64_t> t{targets[static_cast<size_t>(r)]};
        GradInputs gr{{grads.grad_logp[static_cast<size_t>(r)]},
                      {grads.grad_lse[static_cast<size_t>(r)]},
                      {grads.grad_entropy[static_cast<size_t>(r)]}};
        alone.push_back(testing::forward_sharded(ref(), x, g, cuts, 1.0f, true, t));
        alone_grad.push_back(
            testing::backward_sharded(ref(), x, g, cuts, 1.0f, t, alone.back(), gr));
      }
      for (int64_t batch : {int64_t{1}, int64_t{7}, int64_t{64}}) {
        for (int64_t start : {int64_t{0}, (s.rows - batch) / 2, s.rows - batch}) {
          SCOPED_TRACE(::testing::Message() << "batch=" << batch << " start=" << start);
          const Logits x = testing::copy_rows(pool, start, batch, s.padded + 13);
          const std::vector<int64_t> t(targets.begin() + start, targets.begin() + start + batch);
          auto sub = [&](const std::vector<float>& v) {
            return std::vector<float>(v.begin() + start, v.begin() + start + batch);
          };
          const GradInputs gb{sub(grads.grad_logp), sub(grads.grad_lse), sub(grads.grad_entropy)};
          const ForwardResult f = testing::forward_sharded(ref(), x, g, cuts, 1.0f, true, t);
          const Logits gr =
              testing::backward_sharded(ref(), x, g, cuts, 1.0f, t, f, gb, s.padded + 7);
          for (int64_t i = 0; i < batch; ++i) {
            const auto ii = static_cast<size_t>(i);
            const ForwardResult& a = alone[static_cast<size_t>(start + i)];
            EXPECT_EQ(bits(f.lse[ii]), bits(a.lse[0])) << i;
            EXPECT_EQ(bits(f.entropy[ii]), bits(a.entropy[0])) << i;
            EXPECT_EQ(bits(f.logp[ii]), bits(a.logp[0])) << i;
            for (size_t j = 0; j < f.nodes.size(); ++j) {
              const NodePartial& p = f.partials[ii * f.nodes.size() + j];
              const NodePartial& q = a.partials[j];
              ASSERT_EQ(bits(p.m), bits(q.m));
              ASSERT_EQ(bits(p.s), bits(q.s));
              ASSERT_EQ(bits(p.u), bits(q.u));
            }
            for (int64_t c = 0; c < s.padded; ++c) {
              ASSERT_EQ(gr.raw(i, c), alone_grad[static_cast<size_t>(start + i)].raw(0, c))
                  << "row " << i << " col " << c;
            }
          }
        }
      }
    }
  }
}

// The tree rule across calls: a node's partial equals merge(children's partials) computed by
// separate calls, and entropy on/off leaves m and s (hence LSE) bitwise unchanged.
TEST(ReferenceInvariance, NodeIsMergeOfChildrenAndEntropyDoesNotChangeLse) {
  std::mt19937_64 rng(6);
  const std::vector<RowKind> kinds = testing::all_row_kinds();
  const Shape s{1001, 1008, 48, 32};
  const TileGeometry g{s.real, s.width};
  const Logits x = testing::make_logits(DType::fp32, s.rows, s.padded, s.real, kinds, rng);
  const ShardSpec spec{0, g, 1.0f};
  for (bool with_entropy : {false, true}) {
    for (int level = 1; level <= g.tree_levels(); ++level) {
      for (int64_t i = 0; (i << level) < g.num_real_tiles(); ++i) {
        const std::vector<TreeNode> nodes{{level, i}, {level - 1, 2 * i}, {level - 1, 2 * i + 1}};
        std::vector<NodePartial> p(static_cast<size_t>(s.rows) * 3);
        ref().node_partials(x.view(), spec, nodes, with_entropy, p);
        for (int64_t r = 0; r < s.rows; ++r) {
          const NodePartial* q = &p[static_cast<size_t>(r) * 3];
          const canon::Partial m =
              canon::merge(canon::Partial{q[1].m, q[1].s, q[1].u},
                           canon::Partial{q[2].m, q[2].s, q[2].u}, with_entropy);
          ASSERT_EQ(bits(q[0].m), bits(m.m));
          ASSERT_EQ(bits(q[0].s), bits(m.s));
          ASSERT_EQ(bits(q[0].u), bits(m.u));
          if (!with_entropy && !canon::is_poisoned(m)) {
            ASSERT_EQ(bits(q[0].u), 0u);  // u is +0 without entropy (NaN only when poisoned)
          }
        }
      }
    }
  }
  std::vector<int64_t> targets(static_cast<size_t>(s.rows), -1);
  const std::vector<int64_t> cuts{0, 21};
  const ForwardResult with = testing::forward_sharded(ref(), x, g, cuts, 1.0f, true, targets);
  const ForwardResult without = testing::forward_sharded(ref(), x, g, cuts, 1.0f, false, targets);
  expect_same_bits(with.lse, without.lse, "lse with vs without entropy");
}

}  // namespace
}  // namespace detlogp
