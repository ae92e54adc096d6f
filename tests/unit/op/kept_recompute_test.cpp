// Recomputed kept sets wired into the operators (KeptSetOptions::top_k / top_p, docs/numerics.md
// "Recomputed kept sets (top-k, top-p)"): a forward with per-row top_k / top_p is, bit for bit
// (logp, LSE, entropy and the backward's gradients), the forward given the selected ids as
// kept_ids, for both operators at TP 1, 2, 4 and uneven shards, and the same bits at every TP
// degree; result.kept_ids are the selection's ids (select_kept_sets_of_logits / _of_fused);
// targets outside the selected sets score -inf or fail on every rank; bad parameters and kept
// ids together with top_k/top_p fail on every rank; a batch of unrestricted rows is the
// full-vocabulary call (batches that mix them: mixed_kept_rows_test.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>

#include "detlogp/fused.hpp"
#include "fused_test_util.hpp"
#include "op/kept_selection.hpp"
#include "op/vocab_layout.hpp"
#include "op_test_util.hpp"
#include "tp_compare.hpp"

namespace detlogp::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kReal = 2000;
constexpr int64_t kRows = 12;

// Every row restricted: top-k, top-p over the full row (the forward's LSE), and both.
const std::vector<int32_t> kTopK = {1, 50, 0, 0, 40, 1024, 0, 5, 200, 7, 0, 3};
const std::vector<float> kTopP = {1.0f,  1.0f, 0.9f,  0.5f,   0.8f,  0.95f,
                                  0.97f, 0.3f, 1e-6f, 0.999f, 0.25f, 1.0f};

std::vector<std::pair<std::string, Layout>> layouts() {
  return {{"TP 1", Layout{kReal, kReal, {{0, kReal}}}},
          {"TP 2", padded_layout(kReal, 2, 128)},
          {"TP 4", padded_layout(kReal, 4, 128)},
          {"TP 3 uneven", uneven_layout(kReal, {3, 9, 4}, 128)}};
}

// Row r's last kept id (a target inside the set), except rows 1 and 6, whose targets are the
// highest real id (outside their sets: they score -inf with OutsideKept::neg_inf).
std::vector<int64_t> targets_of(const std::vector<int64_t>& kept, int64_t width) {
  std::vector<int64_t> t(static_cast<std::size_t>(kRows));
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t j = 0; j < width; ++j) {
      const int64_t id = kept[static_cast<std::size_t>(r * width + j)];
      if (id >= 0) t[static_cast<std::size_t>(r)] = id;
    }
  }
  t[1] = kReal - 1;
  t[6] = kReal - 1;
  return t;
}

ForwardOptions recompute_options(OutsideKept outside) {
  ForwardOptions o;
  o.entropy = true;
  o.entropy_grad = true;
  o.kept.top_k = kTopK;
  o.kept.top_p = kTopP;
  o.kept.outside = outside;
  return o;
}

TEST(KeptRecompute, TheLogitsOpEqualsTheOpGivenTheSelectedIdsAtEveryTpDegree) {
  const ShardKernels& kernels = simd_kernels();
  const VocabParallelLogprob op(kernels, "test");
  const GradInputs grads{.grad_logp = grads_for(kRows, 1),
                         .grad_lse = grads_for(kRows, 2),
                         .grad_entropy = grads_for(kRows, 3)};
  // The sets and targets from TP 1 (the sets do not depend on the targets).
  const Layout tp1 = layouts()[0].second;
  const FullLogits base = make_logits(DType::fp32, kRows, kReal, kReal, 31, 3.0f);
  const TpRun probe = run_tp(op, base, tp1, std::vector<int64_t>(kRows, 0), {},
                             recompute_options(OutsideKept::neg_inf), {});
  const LogprobResult& p = probe.ranks[0].result;
  ASSERT_GT(p.kept_width, 0);
  const std::vector<int64_t> targets = targets_of(p.kept_ids, p.kept_width);
  std::optional<TpRun> first;
  for (const auto& [name, layout] : layouts()) {
    const FullLogits logits = make_logits(DType::fp32, kRows, kReal, layout.padded, 31, 3.0f);
    const TpRun got =
        run_tp(op, logits, layout, targets, {}, recompute_options(OutsideKept::neg_inf), grads);
    const LogprobResult& g = got.ranks[0].result;
    EXPECT_EQ(g.kept_ids, p.kept_ids) << name;
    EXPECT_EQ(g.kept_width, p.kept_width) << name;
    for (const RankOutputs& r : got.ranks) EXPECT_EQ(r.result.kept_ids, g.kept_ids) << name;
    EXPECT_TRUE(std::isinf(g.logp[1]) && g.logp[1] < 0) << name;
    EXPECT_TRUE(std::isfinite(g.logp[0])) << name;
    // The op given the selected ids.
    ForwardOptions given = recompute_options(OutsideKept::neg_inf);
    given.kept.top_k = {};
    given.kept.top_p = {};
    given.kept.ids = g.kept_ids;
    given.kept.width = g.kept_width;
    const TpRun want = run_tp(op, logits, layout, targets, {}, given, grads);
    expect_same(want, got, kReal, name + ": top_k/top_p vs kept_ids");
    if (first) {
      expect_same(*first, got, kReal, name + " vs TP 1");
    } else {
      first = got;
    }
    // result.kept_ids are select_kept_sets_of_logits's ids (the forward's LSE for top-p rows).
    const int tp = static_cast<int>(layout.bounds.size());
    run_ranks(tp, [&](Communicator& comm) {
      const int r = comm.rank();
      const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
      const LogprobContract c = make_contract(layout, r, kRows, {});
      const LogitsView shard = logits.shard(b.start, b.end);
      const LogprobResult fwd = op.forward(shard, targets, c, comm, {});
      const op::KeptSelection s = op::select_kept_sets_of_logits(
          comm, kernels, c, shard, {}, {.top_k = kTopK, .top_p = kTopP}, fwd.lse);
      EXPECT_EQ(s.ids, g.kept_ids) << name << " rank " << r;
      EXPECT_EQ(s.width, g.kept_width) << name << " rank " << r;
    });
  }
}

TEST(KeptRecompute, TheFusedOpEqualsTheOpGivenTheSelectedIdsAtEveryTpDegree) {
  const int64_t hs = 40;
  const FullLogits hidden = make_matrix(DType::bf16, kRows, hs, 41, 1.0f);
  const ContractOptions copt{.dtype = DType::bf16, .softcap = 20.0f};
  const GradInputs grads{.grad_logp = grads_for(kRows, 4),
                         .grad_lse = grads_for(kRows, 5),
                         .grad_entropy = grads_for(kRows, 6)};
  FusedOptions fo;
  fo.entropy = true;
  fo.kept.top_k = kTopK;
  fo.kept.top_p = kTopP;
  fo.kept.outside = OutsideKept::neg_inf;
  std::vector<int64_t> targets;
  std::optional<FusedRun> first;
  for (const auto& [name, layout] : layouts()) {
    // The same real weight rows at every layout (padding rows differ).
    const FullLogits weight = make_logits(DType::bf16, layout.padded, hs, hs, 42, 0.5f, 0.0f);
    if (targets.empty()) {
      const FusedRun probe = run_fused(hidden, weight, layout, std::vector<int64_t>(kRows, 0), copt,
                                       {.fused = fo, .backward = false});
      targets = targets_of(probe.ranks[0].kept_ids, probe.ranks[0].kept_width);
    }
    const FusedRun got =
        run_fused(hidden, weight, layout, targets, copt, {.fused = fo, .grads = grads});
    const FusedLogprobResult& g = got.ranks[0];
    ASSERT_GT(g.kept_width, 0) << name;
    EXPECT_TRUE(std::isinf(g.logp[6]) && g.logp[6] < 0) << name;
    FusedOptions given = fo;
    given.kept.top_k = {};
    given.kept.top_p = {};
    given.kept.ids = g.kept_ids;
    given.kept.width = g.kept_width;
    const FusedRun want =
        run_fused(hidden, weight, layout, targets, copt, {.fused = given, .grads = grads});
    for (std::size_t r = 0; r < got.ranks.size(); ++r) {
      const std::string what = name + " rank " + std::to_string(r);
      EXPECT_EQ(got.ranks[r].kept_ids, g.kept_ids) << what;
      EXPECT_EQ(bits(got.ranks[r].logp), bits(want.ranks[r].logp)) << what;
      EXPECT_EQ(bits(got.ranks[r].lse), bits(want.ranks[r].lse)) << what;
      EXPECT_EQ(bits(got.ranks[r].entropy), bits(want.ranks[r].entropy)) << what;
      EXPECT_EQ(bits(got.grad_hidden[r]), bits(want.grad_hidden[r])) << what;
    }
    EXPECT_EQ(bits(got.grad_weight), bits(want.grad_weight)) << name;
    if (first) {
      const FusedLogprobResult& f = first->ranks[0];
      EXPECT_EQ(g.kept_ids, f.kept_ids) << name << " vs TP 1";
      EXPECT_EQ(bits(g.logp), bits(f.logp)) << name << " vs TP 1";
      EXPECT_EQ(bits(g.lse), bits(f.lse)) << name << " vs TP 1";
      EXPECT_EQ(bits(g.entropy), bits(f.entropy)) << name << " vs TP 1";
      EXPECT_EQ(bits(got.grad_hidden[0]), bits(first->grad_hidden[0])) << name << " vs TP 1";
      const auto real_rows = [&](const std::vector<float>& w) {
        return bits(std::vector<float>(w.begin(), w.begin() + kReal * hs));
      };
      EXPECT_EQ(real_rows(got.grad_weight), real_rows(first->grad_weight)) << name << " vs TP 1";
    } else {
      first = got;
    }
  }
}

// Every rank's error of a logits-op forward at TP 2 with `kept`.
RankErrors logits_errors(const KeptSetOptions& kept, const std::vector<int64_t>& targets) {
  const Layout layout = padded_layout(kReal, 2, 128);
  const FullLogits logits = make_logits(DType::fp32, kRows, kReal, layout.padded, 31, 3.0f);
  const VocabParallelLogprob op(simd_kernels(), "test");
  return rank_errors(2, [&](Communicator& comm) {
    const int r = comm.rank();
    const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
    ForwardOptions o;
    o.kept = kept;
    (void)op.forward(logits.shard(b.start, b.end), targets, make_contract(layout, r, kRows, {}),
                     comm, o);
  });
}

void expect_all_fail(const RankErrors& e, const std::string& text) {
  ASSERT_TRUE(e.finished);
  for (std::size_t r = 0; r < e.errors.size(); ++r) {
    EXPECT_THAT(e.errors[r], HasSubstr(text)) << "rank " << r;
  }
}

TEST(KeptRecompute, ErrorsFailOnEveryRank) {
  const std::vector<int64_t> zeros(kRows, 0);
  const std::vector<int64_t> ids(kRows, 0);
  // kept_ids together with top_k.
  expect_all_fail(logits_errors({.ids = ids, .width = 1, .top_k = kTopK}, zeros),
                  "pass either kept_ids or top_k/top_p");
  // A bad value on one rank only: the preflight makes both fail.
  const std::vector<int32_t> good(kRows, 5);
  std::vector<int32_t> bad = good;
  bad[4] = 2000;
  {
    const Layout layout = padded_layout(kReal, 2, 128);
    const FullLogits logits = make_logits(DType::fp32, kRows, kReal, layout.padded, 31, 3.0f);
    const VocabParallelLogprob op(simd_kernels(), "test");
    const RankErrors e = rank_errors(2, [&](Communicator& comm) {
      const int r = comm.rank();
      const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
      ForwardOptions o;
      o.kept.top_k = r == 1 ? std::span<const int32_t>(bad) : std::span<const int32_t>(good);
      (void)op.forward(logits.shard(b.start, b.end), zeros, make_contract(layout, r, kRows, {}),
                       comm, o);
    });
    ASSERT_TRUE(e.finished);
    EXPECT_THAT(e.errors[1], HasSubstr("top_k of row 4 is 2000"));
    EXPECT_FALSE(e.errors[0].empty());
  }
  // A target outside its selected set with OutsideKept::error (the default): every rank.
  std::vector<int64_t> outside(kRows, 0);
  const std::vector<int32_t> one(kRows, 1);
  const RankErrors e = logits_errors({.top_k = one}, outside);
  ASSERT_TRUE(e.finished);
  int failed = 0;
  for (const std::string& msg : e.errors)
    failed += msg.find("selected by its top_k/top_p") != std::string::npos;
  EXPECT_EQ(failed, 2);
}

TEST(KeptRecompute, UnrestrictedRowsAreTheFullVocabularyCall) {
  const Layout layout = padded_layout(kReal, 2, 128);
  const FullLogits logits = make_logits(DType::fp32, kRows, kReal, layout.padded, 31, 3.0f);
  const VocabParallelLogprob op(simd_kernels(), "test");
  const std::vector<int64_t> targets = targets_for(kRows, kReal, 7);
  ForwardOptions off;
  const std::vector<int32_t> k(kRows, 0);
  const std::vector<float> p(kRows, 1.0f);
  off.kept.top_k = k;
  off.kept.top_p = p;
  const TpRun got = run_tp(op, logits, layout, targets, {}, off, {});
  const TpRun want = run_tp(op, logits, layout, targets, {}, {}, {});
  EXPECT_EQ(bits(got.ranks[0].result.logp), bits(want.ranks[0].result.logp));
  EXPECT_EQ(bits(got.ranks[0].result.lse), bits(want.ranks[0].result.lse));
  EXPECT_TRUE(got.ranks[0].result.kept_ids.empty());
  EXPECT_EQ(got.ranks[0].result.kept_width, 0);
}

}  // namespace
}  // namespace detlogp::testing
