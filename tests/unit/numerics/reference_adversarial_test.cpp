// The scalar reference kernels on adversarial rows (docs/numerics.md): huge and -1e30
// logits, -inf in real columns, rows whose only finite logit is the target, ties, subnormals,
// -0.0, constant rows, all -inf rows, NaN and +inf, finite logits whose differences overflow,
// tiles partly padding, vocab sizes not multiples of 32 or W, W not a multiple of 32. Also the
// contract checks (ContractError) of every kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "detlogp/errors.hpp"
#include "detlogp/kernels.hpp"
#include "numerics/canon.hpp"
#include "testing/logits_gen.hpp"
#include "testing/shard_pipeline.hpp"
#include "ulp.hpp"

namespace detlogp {
namespace {

using testing::bits;
using testing::ForwardResult;
using testing::GradInputs;
using testing::kCanonicalNan;
using testing::kInf;
using testing::Logits;
using testing::RowKind;

const ShardKernels& ref() { return reference_kernels(); }

enum class RowClass { finite, identity, poisoned };

// What the canon says a row is, from its actual real z values (after narrowing to the dtype).
RowClass classify(const Logits& x, int64_t r, int64_t real, float tau) {
  bool all_neg_inf = true;
  for (int64_t c = 0; c < real; ++c) {
    const float z = canon::scale_logit(x.get(r, c), tau);
    if (std::isnan(z) || z == kInf) return RowClass::poisoned;
    if (z != -kInf) all_neg_inf = false;
  }
  return all_neg_inf ? RowClass::identity : RowClass::finite;
}

struct Shape {
  int64_t real, padded, width;
};

TEST(ReferenceAdversarial, CanonOutcomesForEveryRowKind) {
  std::mt19937_64 rng(21);
  const std::vector<RowKind> kinds = testing::all_row_kinds();
  const int64_t rows = 2 * static_cast<int64_t>(kinds.size());
  for (const Shape& s :
       {Shape{1000, 1024, 128}, Shape{1001, 1056, 48}, Shape{37, 40, 4}, Shape{100, 128, 32},
        Shape{33, 33, 128}, Shape{5, 8, 4}, Shape{1, 128, 128}}) {
    const TileGeometry g{s.real, s.width};
    for (DType dtype : {DType::fp32, DType::bf16, DType::fp16}) {
      for (float tau : {1.0f, 0.75f}) {
        SCOPED_TRACE(::testing::Message()
                     << "R=" << s.real << " padded=" << s.padded << " W=" << s.width
                     << " dtype=" << static_cast<int>(dtype) << " tau=" << tau);
        std::vector<int64_t> targets;
        const Logits x = testing::make_logits(dtype, rows, s.padded, s.real, kinds, rng, &targets);
        const std::vector<int64_t> cuts = testing::make_cuts(s.padded, s.width, 3, false, rng);
        const ForwardResult f = testing::forward_sharded(ref(), x, g, cuts, tau, true, targets);
        const ForwardResult f0 = testing::forward_sharded(ref(), x, g, cuts, tau, false, targets);
        GradInputs grads;
        std::uniform_real_distribution<float> u(-2.0f, 2.0f);
        for (int64_t r = 0; r < rows; ++r) {
          grads.grad_logp.push_back(u(rng));
          grads.grad_lse.push_back(u(rng));
          grads.grad_entropy.push_back(u(rng));
        }
        const Logits grad = testing::backward_sharded(ref(), x, g, cuts, tau, targets, f, grads);
        for (int64_t r = 0; r < rows; ++r) {
          const auto ri = static_cast<size_t>(r);
          const RowKind kind = kinds[ri % kinds.size()];
          SCOPED_TRACE(::testing::Message()
                       << "row " << r << " kind " << testing::row_kind_name(kind));
          const float lse = f.lse[ri];
          const float h = f.entropy[ri];
          // LSE never depends on whether entropy was computed.
          EXPECT_EQ(bits(lse), bits(f0.lse[ri]));
          const float tz = canon::scale_logit(x.get(r, targets[ri]), tau);
          switch (classify(x, r, s.real, tau)) {
            case RowClass::poisoned:
              EXPECT_EQ(bits(lse), kCanonicalNan);
              EXPECT_EQ(bits(h), kCanonicalNan);
              EXPECT_EQ(bits(f.logp[ri]), kCanonicalNan);
              break;
            case RowClass::identity:
              EXPECT_EQ(bits(lse), bits(-kInf));
              EXPECT_EQ(bits(h), 0u);
              break;
            case RowClass::finite: {
              EXPECT_TRUE(std::isfinite(lse)) << lse;
              EXPECT_TRUE(std::isfinite(h)) << h;
              EXPECT_GE(h, -1e-6f * std::fabs(lse));
              EXPECT_LE(h, std::log(static_cast<float>(s.real)) * 1.0001f + 1e-6f);
              EXPECT_FALSE(std::isnan(f.logp[ri]));
              EXPECT_LE(f.logp[ri], 0.0f);
              // LSE >= max z, and the probabilities sum to 1.
              double sum = 0.0;
              float mx = -kInf;
              for (int64_t c = 0; c < s.real; ++c) {
                const float z = canon::scale_logit(x.get(r, c), tau);
                mx = z > mx ? z : mx;
                sum += canon::det_exp(z - lse);
              }
              EXPECT_GE(lse, mx);
              // p = exp(z - LSE) inherits LSE's rounding (relative error up to ulp(LSE)).
              const double ulp_lse = testing::fp32_ulp(lse);
              if (ulp_lse < 0.01) {
                EXPECT_NEAR(sum, 1.0, 1e-4 + 2.0 * ulp_lse);
              }
              if (tz == -kInf) {
                EXPECT_EQ(bits(f.logp[ri]), bits(-kInf));
              }
              break;
            }
          }
          // Gradients: never NaN for non-NaN inputs (a poisoned row has p = 0 everywhere);
          // padding exactly +0.
          for (int64_t c = 0; c < s.padded; ++c) {
            if (c >= s.real) {
              ASSERT_EQ(grad.raw(r, c), 0u) << c;
              continue;
            }
            const float gv = grad.get(r, c);
            if (dtype == DType::fp16 && std::isinf(gv)) continue;  // fp16 overflow is allowed
            ASSERT_FALSE(std::isnan(gv)) << "col " << c;
          }
        }
        // Exact cases.
        for (int64_t r = 0; r < rows; ++r) {
          const auto ri = static_cast<size_t>(r);
          const RowKind kind = kinds[ri % kinds.size()];
          const float logr = canon::det_log(static_cast<float>(s.real));
          if (kind == RowKind::only_target_finite) {
            // S = 1: LSE is the target logit exactly, logp = 0, entropy = 0.
            EXPECT_EQ(bits(f.lse[ri]), bits(f.target_z[ri])) << r;
            EXPECT_EQ(bits(f.logp[ri]), 0u) << r;
            EXPECT_EQ(bits(f.entropy[ri]), 0u) << r;
            for (int64_t c = 0; c < s.real; ++c) {
              if (c != targets[ri]) {
                EXPECT_EQ(grad.get(r, c), 0.0f) << c;  // p = 0 off the target
              }
            }
          }
          if (kind == RowKind::constant || kind == RowKind::signed_zero ||
              kind == RowKind::neg_zero) {
            // Every real z equal: S = R exactly, U = 0, so H = log R and LSE = z + log R.
            const float z = canon::scale_logit(x.get(r, 0), tau);
            EXPECT_EQ(bits(f.entropy[ri]), bits(logr)) << r;
            EXPECT_EQ(bits(f.lse[ri]), bits(z + logr)) << r;  // -0 + log R == +0 + log R
          }
        }
      }
    }
  }
}

// Finite logits whose maxima differ by more than FLT_MAX (e.g. +-3e38 in different tiles): the
// entropy merge must not compute 0 * -inf. LSE is the max, entropy 0, both finite.
TEST(ReferenceAdversarial, ExtremeFiniteRangeAcrossTiles) {
  const TileGeometry g{256, 128};
  for (DType dtype : {DType::fp32, DType::bf16}) {
    Logits x(dtype, 2, 256);
    for (int64_t c = 0; c < 256; ++c) {
      x.set(0, c, c < 128 ? -3e38f : 3e38f);  // left tile far below the right one
      x.set(1, c, c < 128 ? 3e38f : -3e38f);  // and the other way round
    }
    const std::vector<int64_t> targets{200, 3};
    for (const std::vector<int64_t>& cuts :
         {std::vector<int64_t>{0, 2}, std::vector<int64_t>{0, 1, 2}}) {
      const ForwardResult f = testing::forward_sharded(ref(), x, g, cuts, 1.0f, true, targets);
      const ForwardResult f0 = testing::forward_sharded(ref(), x, g, cuts, 1.0f, false, targets);
      for (size_t r = 0; r < 2; ++r) {
        const float top = x.get(static_cast<int64_t>(r), r == 0 ? 255 : 0);
        EXPECT_TRUE(std::isfinite(f.lse[r])) << r;
        EXPECT_TRUE(std::isfinite(f.entropy[r])) << r;
        EXPECT_EQ(bits(f.lse[r]), bits(f0.lse[r])) << r;
        // 128 equal maxima: LSE = top + log 128 (rounds to top), H = log 128.
        EXPECT_EQ(bits(f.lse[r]), bits(top + canon::det_log(128.0f))) << r;
        EXPECT_EQ(bits(f.entropy[r]), bits(canon::det_log(128.0f))) << r;
      }
    }
  }
}

// A NaN or +inf only in padding columns, or beyond cols in the row stride, changes nothing;
// -inf in every real column gives LSE = -inf, not NaN.
TEST(ReferenceAdversarial, GarbageOutsideRealColumnsIsIgnored) {
  std::mt19937_64 rng(22);
  const TileGeometry g{100, 32};
  const std::vector<RowKind> kinds{RowKind::normal, RowKind::all_neg_inf};
  std::vector<int64_t> targets;
  Logits clean = testing::make_logits(DType::fp32, 2, 128, 100, kinds, rng, &targets, 150);
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t c = 100; c < 150; ++c) clean.set(r, c, -1.0f);
  }
  Logits dirty = clean;
  testing::fill_padding_garbage(dirty, 100);
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t c = 128; c < 150; ++c) dirty.set(r, c, testing::from_bits(0x7fc00000u));
  }
  const std::vector<int64_t> cuts{0, 2, 4};
  const ForwardResult a = testing::forward_sharded(ref(), clean, g, cuts, 1.0f, true, targets);
  const ForwardResult b = testing::forward_sharded(ref(), dirty, g, cuts, 1.0f, true, targets);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(bits(a.lse[r]), bits(b.lse[r]));
    EXPECT_EQ(bits(a.entropy[r]), bits(b.entropy[r]));
  }
  EXPECT_EQ(bits(a.lse[1]), bits(-kInf));
  EXPECT_TRUE(std::isfinite(a.lse[0]));
}

// ---------------------------------------------------------------------------------------------
// Contract checks.

class ReferenceContract : public ::testing::Test {
 protected:
  TileGeometry g{1000, 128};  // T = 8, K = 3
  Logits x{DType::fp32, 2, 1024};
  std::vector<NodePartial> out = std::vector<NodePartial>(2);
};

TEST_F(ReferenceContract, NodePartialsRejectsBadInputs) {
  const std::vector<TreeNode> root{{3, 0}};
  const ShardSpec spec{0, g, 1.0f};
  EXPECT_NO_THROW(ref().node_partials(x.view(), spec, root, true, std::span(out).first(2)));
  // vocab_start not a multiple of W.
  EXPECT_THROW(ref().node_partials(x.view_cols(64, 512), ShardSpec{64, g, 1.0f}, {}, true,
                                   std::span(out).first(0)),
               ContractError);
  // shard end inside the real vocabulary and not tile-aligned.
  EXPECT_THROW(ref().node_partials(x.view_cols(0, 500), spec, {}, true, std::span(out).first(0)),
               ContractError);
  // node outside the shard's tiles.
  const std::vector<TreeNode> leaf5{{0, 5}};
  EXPECT_THROW(ref().node_partials(x.view_cols(0, 512), spec, leaf5, true, out), ContractError);
  // node not in the tree (level > K, index out of range).
  EXPECT_THROW(ref().node_partials(x.view(), spec, std::vector<TreeNode>{{4, 0}}, true, out),
               ContractError);
  EXPECT_THROW(ref().node_partials(x.view(), spec, std::vector<TreeNode>{{0, 8}}, true, out),
               ContractError);
  EXPECT_THROW(ref().node_partials(x.view(), spec, std::vector<TreeNode>{{0, -1}}, true, out),
               ContractError);
  // out of the wrong size.
  std::vector<NodePartial> small(1);
  EXPECT_THROW(ref().node_partials(x.view(), spec, root, true, small), ContractError);
  // row_stride < cols, bad W, bad temperature.
  LogitsView bad = x.view();
  bad.row_stride = 10;
  EXPECT_THROW(ref().node_partials(bad, spec, root, true, out), ContractError);
  EXPECT_THROW(ref().node_partials(x.view(), ShardSpec{0, TileGeometry{1000, 0}, 1.0f}, {}, true,
                                   std::span(out).first(0)),
               ContractError);
  for (float tau : {0.0f, -1.0f, kInf, testing::from_bits(0x7fc00000u)}) {
    EXPECT_THROW(ref().node_partials(x.view(), ShardSpec{0, g, tau}, root, true, out),
                 ContractError);
  }
  // The last shard may end inside a tile when that end is at or after R.
  EXPECT_NO_THROW(ref().node_partials(x.view_cols(0, 1000), spec, root, true, out));
  EXPECT_NO_THROW(ref().node_partials(x.view_cols(896, 104), ShardSpec{896, g, 1.0f},
                                      std::vector<TreeNode>{{0, 7}}, true, out));
}

TEST_F(ReferenceContract, MergeRootsRequiresAnExactCover) {
  std::vector<float> lse(2), h(2);
  auto merge = [&](std::vector<TreeNode> nodes) {
    std::vector<NodePartial> p(2 * nodes.size(), NodePartial{0.0f, 1.0f, 0.0f});
    ref().merge_roots(g, nodes, p, 2, RootsOut{lse, h});
  };
  EXPECT_NO_THROW(merge({{3, 0}}));
  EXPECT_NO_THROW(merge({{2, 0}, {1, 2}, {0, 6}, {0, 7}}));
  EXPECT_NO_THROW(merge({{0, 7}, {2, 0}, {0, 6}, {1, 2}}));              // any order
  EXPECT_THROW(merge({{2, 0}, {1, 2}, {0, 6}}), ContractError);          // tile 7 missing
  EXPECT_THROW(merge({{2, 0}, {1, 2}, {1, 3}, {0, 7}}), ContractError);  // tile 7 twice
  EXPECT_THROW(merge({{3, 0}, {3, 0}}), ContractError);                  // duplicate
  EXPECT_THROW(merge({{4, 0}}), ContractError);                          // not a tree node
  EXPECT_THROW(merge({}), ContractError);
  // Sizes.
  std::vector<NodePartial> p(2);
  std::vector<float> lse1(1);
  const std::vector<TreeNode> root{{3, 0}};
  EXPECT_THROW(ref().merge_roots(g, root, std::span(p).first(1), 2, RootsOut{lse, h}),
               ContractError);
  EXPECT_THROW(ref().merge_roots(g, root, p, 2, RootsOut{lse1, h}), ContractError);
  EXPECT_THROW(ref().merge_roots(g, root, p, 2, RootsOut{lse, lse1}), ContractError);
  EXPECT_NO_THROW(ref().merge_roots(g, root, p, 2, RootsOut{lse, {}}));
}

TEST_F(ReferenceContract, MergeRootsWithPaddingTiles) {
  // T = 3 (R = 300, W = 128): leaf 3 is padding; a node reaching into it is fine, a node made
  // only of padding tiles is not part of any cover.
  const TileGeometry g3{300, 128};
  std::vector<float> lse(1);
  const std::vector<TreeNode> a{{1, 0}, {1, 1}};
  std::vector<NodePartial> p{{1.0f, 1.0f, 0.0f}, {2.0f, 1.0f, 0.0f}};
  EXPECT_NO_THROW(ref().merge_roots(g3, a, p, 1, RootsOut{lse, {}}));
  const std::vector<TreeNode> b{{1, 0}, {0, 2}, {0, 3}};
  std::vector<NodePartial> q{{1.0f, 1.0f, 0.0f}, {2.0f, 1.0f, 0.0f}, {0.0f, 0.0f, 0.0f}};
  EXPECT_THROW(ref().merge_roots(g3, b, q, 1, RootsOut{lse, {}}), ContractError);
}

TEST_F(ReferenceContract, BackwardAndTargetsRejectBadInputs) {
  const ShardSpec spec{0, g, 1.0f};
  std::vector<float> lse(2, 1.0f), h(2, 0.5f), gl(2, 1.0f), tz(2);
  std::vector<int64_t> t{3, -1};
  Logits grad(DType::fp32, 2, 1024);
  BackwardInputs in;
  in.lse = lse;
  in.target_local = t;
  in.grad_logp = gl;
  EXPECT_NO_THROW(ref().backward(x.view(), spec, in, grad.mutable_view()));
  Logits grad16(DType::bf16, 2, 1024);
  EXPECT_THROW(ref().backward(x.view(), spec, in, grad16.mutable_view()), ContractError);
  Logits grad_small(DType::fp32, 2, 512);
  EXPECT_THROW(ref().backward(x.view(), spec, in, grad_small.mutable_view()), ContractError);
  BackwardInputs no_entropy = in;
  no_entropy.grad_entropy = gl;  // entropy needed but missing
  EXPECT_THROW(ref().backward(x.view(), spec, no_entropy, grad.mutable_view()), ContractError);
  BackwardInputs short_lse = in;
  short_lse.lse = std::span(lse).first(1);
  EXPECT_THROW(ref().backward(x.view(), spec, short_lse, grad.mutable_view()), ContractError);
  for (int64_t bad : {int64_t{-2}, int64_t{1000}, int64_t{1024}}) {  // 1000: padding column
    std::vector<int64_t> tb{bad, -1};
    BackwardInputs bt = in;
    bt.target_local = tb;
    EXPECT_THROW(ref().backward(x.view(), spec, bt, grad.mutable_view()), ContractError) << bad;
    EXPECT_THROW(read_target_logits(x.view(), spec, tb, tz), ContractError) << bad;
  }
  std::vector<float> tz1(1);
  EXPECT_THROW(read_target_logits(x.view(), spec, t, tz1), ContractError);
}

TEST(ReferenceTargets, ReadsScaledTargetOrZero) {
  Logits x(DType::bf16, 3, 256, 300);
  x.set(0, 10, 3.0f);
  x.set(1, 200, -7.5f);
  x.set(2, 5, testing::from_bits(0x7fa00001u));  // NaN with a payload
  const ShardSpec spec{128, TileGeometry{1000, 128}, 2.0f};
  const std::vector<int64_t> t{10, -1, 5};
  std::vector<float> out(3, 9.0f);
  read_target_logits(x.view(), spec, t, out);
  EXPECT_EQ(bits(out[0]), bits(1.5f));
  EXPECT_EQ(bits(out[1]), 0u);
  EXPECT_EQ(bits(out[2]), kCanonicalNan);
}

}  // namespace
}  // namespace detlogp
