// Kept sets through the fused lm_head (FusedOptions::kept): logp, LSE and entropy are bit for bit
// the logits operator's kept-set outputs on the fp32 logits of linear_logits, at every TP degree
// (even and uneven shards), on every fused kernel, with a softcap and per-row temperatures;
// grad_weight and grad_hidden are the same on every rank, TP degree and kernel, and equal the
// dense chains (over every column, from the logits operator's logit gradient) of the canon:
// skipping the zero-gradient columns changes no bit; rows of ids no row kept get +0; a target
// outside its set (neg_inf) contributes no logp gradient; bad ids fail on every rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "detlogp/fused.hpp"
#include "fused_test_util.hpp"
#include "kernels/cpu/fused/tree_stack.hpp"
#include "numerics/linear_canon.hpp"
#include "tp_compare.hpp"

namespace detlogp::testing {
namespace {

using ::testing::HasSubstr;

// The dense chains of the canon from a full fp32 logit gradient g [rows, padded] (+0 outside
// the kept sets): grad_weight over every token, grad_hidden per tile over every real column,
// then the canonical tree over the real tiles.
struct Dense {
  std::vector<float> grad_weight;  // [padded, H]
  std::vector<float> grad_hidden;  // [rows, H]
};
Dense dense_chains(const FullLogits& g, const FullLogits& hidden, const FullLogits& weight,
                   int64_t real, int64_t w) {
  const int64_t rows = hidden.rows, hs = hidden.cols;
  Dense d;
  d.grad_weight.assign(static_cast<std::size_t>(weight.rows * hs), 0.0f);
  for (int64_t c = 0; c < real; ++c) {
    for (int64_t h = 0; h < hs; ++h) {
      float acc = 0.0f;
      for (int64_t i = 0; i < rows; ++i) acc = canon::chain_step(g.at(i, c), hidden.at(i, h), acc);
      d.grad_weight[c * hs + h] = acc;
    }
  }
  using Plane = std::vector<float>;
  auto merge = [](Plane& l, Plane&& r) {
    for (std::size_t k = 0; k < l.size(); ++k) l[k] = l[k] + r[k];
  };
  fused::TreeStack<Plane, decltype(merge)> stack(merge);
  const int64_t tiles = (real + w - 1) / w;
  for (int64_t t = 0; t < tiles; ++t) {
    Plane p(static_cast<std::size_t>(rows * hs), 0.0f);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t c = t * w; c < std::min(real, (t + 1) * w); ++c) {
        for (int64_t h = 0; h < hs; ++h) {
          p[i * hs + h] = canon::chain_step(g.at(i, c), weight.at(c, h), p[i * hs + h]);
        }
      }
    }
    stack.push(TreeNode{0, t}, std::move(p));
  }
  d.grad_hidden = stack.finish();
  return d;
}

TEST(FusedKeptSet, TheLogitsOperatorsBitsAndTheDenseChainsAtEveryTpAndKernel) {
  const int64_t real = 900, hs = 40, rows = 7, w = 64, width = 200;
  const FullLogits hidden = make_matrix(DType::bf16, rows, hs, 41, 1.0f);
  const auto targets = targets_for(rows, real, 42);
  const auto ids = kept_for(targets, real, width, {1, 3, 65, 200, 130, 64, 9}, 43);
  const std::vector<float> temps = {0.7f, 1.0f, 1.9f, 0.5f, 1.0f, 3.0f, 0.9f};
  const GradInputs grads{grads_for(rows, 44), grads_for(rows, 45), grads_for(rows, 46)};
  const std::vector<Layout> layouts = {padded_layout(real, 1, w), padded_layout(real, 2, w),
                                       padded_layout(real, 4, w),
                                       uneven_layout(real, {1, 9, 2, 3}, w)};
  int64_t widest = 0;
  for (const Layout& l : layouts) widest = std::max(widest, l.padded);
  const FullLogits weight = make_matrix(DType::bf16, widest, hs, 47, 0.5f);
  for (std::optional<float> cap : {std::optional<float>(), std::optional<float>(4.0f)}) {
    const ContractOptions copt{.tile_width = w, .softcap = cap};
    const ForwardOptions lopt{
        .entropy = true, .row_temperature = temps, .kept = {.ids = ids, .width = width}};
    // The logits operator on the fp32 logits of linear_logits (TP 1).
    const FullLogits z = logits_of(hidden, weight);
    const VocabParallelLogprob lop(reference_kernels(), "test-reference");
    const Layout whole_layout{real, widest, {{0, widest}}};
    const TpRun want = run_tp(lop, z, whole_layout, targets, copt, lopt, grads);
    const Dense dense = dense_chains(want.grad, hidden, weight, real, w);
    std::optional<FusedRun> first;
    for (const Layout& layout : layouts) {
      for (const std::string& k : fused_kernel_names()) {
        const std::string what =
            k + " TP " + std::to_string(layout.bounds.size()) + (cap ? " cap" : "");
        FusedRunOptions o{.kernel = k,
                          .fused = {.entropy = true,
                                    .row_block = 3,
                                    .row_temperature = temps,
                                    .kept = {.ids = ids, .width = width}},
                          .grads = grads};
        const FusedRun run = run_fused(hidden, weight, layout, targets, copt, o);
        for (std::size_t r = 0; r < run.ranks.size(); ++r) {
          const FusedLogprobResult& f = run.ranks[r];
          const LogprobResult& l = want.ranks[0].result;
          EXPECT_EQ(bits(f.logp), bits(l.logp)) << what;
          EXPECT_EQ(bits(f.lse), bits(l.lse)) << what;
          EXPECT_EQ(bits(f.entropy), bits(l.entropy)) << what;
          EXPECT_EQ(f.kept_ids, l.kept_ids) << what;
          EXPECT_EQ(bits(run.grad_hidden[r]), bits(dense.grad_hidden)) << what << " rank " << r;
        }
        for (int64_t c = 0; c < layout.padded; ++c) {
          for (int64_t h = 0; h < hs; ++h) {
            ASSERT_EQ(canon::bits_of(run.grad_weight[c * hs + h]),
                      canon::bits_of(dense.grad_weight[c * hs + h]))
                << what << " grad_weight row " << c;
          }
        }
      }
    }
  }
}

// neg_inf: the row whose target is outside its set gets -inf and no logp gradient; bad ids fail
// on every rank naming the row and the id.
TEST(FusedKeptSet, OutsideTargetsAndBadIds) {
  const int64_t real = 300, hs = 16, rows = 3, w = 64, width = 4;
  const FullLogits hidden = make_matrix(DType::fp32, rows, hs, 51, 1.0f);
  const Layout layout = padded_layout(real, 2, w);
  const FullLogits weight = make_matrix(DType::fp32, layout.padded, hs, 52, 0.5f);
  const std::vector<int64_t> targets = {5, 200, 7};
  const std::vector<int64_t> ids = {5, 290, -1, 1, 3, 4, -1, -1, 7, 100, 150, 250};
  const std::vector<float> gl = {1.0f, -2.0f, 0.5f}, gl0 = {1.0f, 0.0f, 0.5f};
  const std::vector<float> ge = {0.3f, 0.2f, 0.1f};
  FusedRunOptions o{
      .fused = {.entropy = true,
                .kept = {.ids = ids, .width = width, .outside = OutsideKept::neg_inf}},
      .grads = {gl, {}, ge}};
  const FusedRun run = run_fused(hidden, weight, layout, targets, {.tile_width = w}, o);
  EXPECT_TRUE(std::isinf(run.ranks[0].logp[1]) && run.ranks[0].logp[1] < 0);
  o.grads = {gl0, {}, ge};
  const FusedRun zeroed = run_fused(hidden, weight, layout, targets, {.tile_width = w}, o);
  EXPECT_EQ(bits(run.grad_hidden[0]), bits(zeroed.grad_hidden[0]));
  EXPECT_EQ(bits(run.grad_weight), bits(zeroed.grad_weight));
  // A duplicate on rank 1 only: both ranks fail naming row 2 and id 100.
  const std::vector<int64_t> bad = {5, 290, -1, 1, 3, 4, -1, 200, 7, 100, 100, 250};
  const FusedLinearLogprob op;
  const RankErrors errs = rank_errors(2, [&](Communicator& comm) {
    const int r = comm.rank();
    const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
    const LogprobContract c = make_contract(layout, r, rows, {.tile_width = w});
    op.forward(
        whole(hidden), row_range(weight, b.start, b.end), targets, c, comm,
        {.kept = {.ids = r == 1 ? bad : ids, .width = width, .outside = OutsideKept::neg_inf}});
  });
  ASSERT_TRUE(errs.finished);
  for (const std::string& e : errs.errors) EXPECT_THAT(e, HasSubstr("row 2 holds id 100 twice"));
}

}  // namespace
}  // namespace detlogp::testing
