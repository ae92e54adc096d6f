// Batches that mix restricted and unrestricted rows (docs/numerics.md "Recomputed kept sets
// (top-k, top-p)", "Kept sets"): with per-row top_k / top_p where some rows are unrestricted, or
// given kept ids with rows of only -1 and EmptyKeptRow::full_vocabulary, each unrestricted row
// has the bits of the call without kept sets (logp, LSE, entropy, its gradient row) and each
// restricted row those of the kept-set call, for both operators, forward and backward, the same
// bits at every TP degree (vLLM's unaligned bounds for the logits operator); the recomputed and
// the given forms agree; result.kept_ids is all -1 on unrestricted rows; without the opt-in an
// empty active row fails on every rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "detlogp/fused.hpp"
#include "fused_test_util.hpp"
#include "op_test_util.hpp"
#include "tp_compare.hpp"

namespace detlogp::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kReal = 2000;
constexpr int64_t kRows = 10;

// Rows 1, 4, 5 and 9 unrestricted (top_k 0, top_p 1), the others by top-k, top-p or both.
const std::vector<int32_t> kTopK = {50, 0, 0, 7, 0, 0, 1, 200, 0, 0};
const std::vector<float> kTopP = {1.0f, 1.0f, 0.9f, 0.8f, 1.0f, 1.0f, 1.0f, 0.95f, 0.5f, 1.0f};
const std::vector<int64_t> kUnrestricted = {1, 4, 5, 9};

bool unrestricted(int64_t r) {
  return std::find(kUnrestricted.begin(), kUnrestricted.end(), r) != kUnrestricted.end();
}

std::vector<std::pair<std::string, Layout>> aligned_layouts() {
  return {{"TP 1", Layout{kReal, kReal, {{0, kReal}}}},
          {"TP 2", padded_layout(kReal, 2, 128)},
          {"TP 4", padded_layout(kReal, 4, 128)},
          {"TP 3 uneven", uneven_layout(kReal, {3, 9, 4}, 128)}};
}

std::vector<std::pair<std::string, Layout>> logits_layouts() {
  std::vector<std::pair<std::string, Layout>> out = aligned_layouts();
  for (int64_t tp : {2, 3, 5, 8}) {
    out.push_back({"vLLM TP " + std::to_string(tp), vllm_layout(kReal, tp)});
  }
  return out;
}

// Restricted rows: their last kept id; unrestricted rows: an id spread over the vocabulary.
std::vector<int64_t> targets_of(const std::vector<int64_t>& kept, int64_t width) {
  std::vector<int64_t> t(static_cast<std::size_t>(kRows));
  for (int64_t r = 0; r < kRows; ++r) {
    t[static_cast<std::size_t>(r)] = (r * 397 + 11) % kReal;
    for (int64_t j = 0; j < width; ++j) {
      const int64_t id = kept[static_cast<std::size_t>(r * width + j)];
      if (id >= 0) t[static_cast<std::size_t>(r)] = id;
    }
  }
  return t;
}

// The ids with each unrestricted row given its target alone (a valid all-restricted call).
std::vector<int64_t> with_targets_kept(std::vector<int64_t> ids, int64_t width,
                                       const std::vector<int64_t>& targets) {
  for (int64_t r : kUnrestricted) ids[static_cast<std::size_t>(r * width)] = targets[r];
  return ids;
}

ForwardOptions logits_options() {
  ForwardOptions o;
  o.entropy = true;
  o.entropy_grad = true;
  o.kept.top_k = kTopK;
  o.kept.top_p = kTopP;
  return o;
}

TEST(MixedKeptRows, TheLogitsOpScoresEachRowAsItsOwnCallAtEveryTpDegree) {
  const VocabParallelLogprob op(simd_kernels(), "test");
  const GradInputs grads{.grad_logp = grads_for(kRows, 1),
                         .grad_lse = grads_for(kRows, 2),
                         .grad_entropy = grads_for(kRows, 3)};
  const FullLogits base = make_logits(DType::fp32, kRows, kReal, kReal, 31, 3.0f);
  const Layout tp1 = logits_layouts()[0].second;
  ForwardOptions probe_opt = logits_options();
  probe_opt.kept.outside = OutsideKept::neg_inf;
  const TpRun probe = run_tp(op, base, tp1, std::vector<int64_t>(kRows, 0), {}, probe_opt, {});
  const LogprobResult& p = probe.ranks[0].result;
  ASSERT_GT(p.kept_width, 0);
  for (int64_t r = 0; r < kRows; ++r) {
    EXPECT_EQ(p.kept_ids[static_cast<std::size_t>(r * p.kept_width)] < 0, unrestricted(r))
        << "kept_ids row " << r;
  }
  const std::vector<int64_t> targets = targets_of(p.kept_ids, p.kept_width);
  std::optional<TpRun> first;
  for (const auto& [name, layout] : logits_layouts()) {
    const FullLogits logits = make_logits(DType::fp32, kRows, kReal, layout.padded, 31, 3.0f);
    const TpRun got = run_tp(op, logits, layout, targets, {}, logits_options(), grads);
    EXPECT_EQ(got.ranks[0].result.kept_ids, p.kept_ids) << name;
    // Unrestricted rows: the call without kept sets.
    ForwardOptions plain;
    plain.entropy = true;
    plain.entropy_grad = true;
    const TpRun full = run_tp(op, logits, layout, targets, {}, plain, grads);
    // Restricted rows: the kept-set call (unrestricted rows given their target alone).
    ForwardOptions kept = plain;
    const std::vector<int64_t> all_kept = with_targets_kept(p.kept_ids, p.kept_width, targets);
    kept.kept.ids = all_kept;
    kept.kept.width = p.kept_width;
    const TpRun restricted = run_tp(op, logits, layout, targets, {}, kept, grads);
    for (int64_t r = 0; r < kRows; ++r) {
      expect_row_same(got, r, unrestricted(r) ? full : restricted, r, kReal, name);
    }
    // The given form: the result's kept_ids (all -1 rows) with EmptyKeptRow::full_vocabulary.
    ForwardOptions given = plain;
    given.kept.ids = p.kept_ids;
    given.kept.width = p.kept_width;
    given.kept.empty_rows = EmptyKeptRow::full_vocabulary;
    expect_same(run_tp(op, logits, layout, targets, {}, given, grads), got, kReal,
                name + ": given vs recomputed");
    if (first) {
      expect_same(*first, got, kReal, name + " vs TP 1");
    } else {
      first = got;
    }
  }
}

TEST(MixedKeptRows, TheFusedOpScoresEachRowAsItsOwnCallAtEveryTpDegree) {
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
  std::vector<int64_t> targets;
  std::vector<int64_t> kept_ids;
  int64_t width = 0;
  std::optional<FusedRun> first;
  for (const auto& [name, layout] : aligned_layouts()) {
    const FullLogits weight = make_logits(DType::bf16, layout.padded, hs, hs, 42, 0.5f, 0.0f);
    if (targets.empty()) {
      FusedOptions probe = fo;
      probe.kept.outside = OutsideKept::neg_inf;
      const FusedRun p = run_fused(hidden, weight, layout, std::vector<int64_t>(kRows, 0), copt,
                                   {.fused = probe, .backward = false});
      kept_ids = p.ranks[0].kept_ids;
      width = p.ranks[0].kept_width;
      ASSERT_GT(width, 0);
      targets = targets_of(kept_ids, width);
    }
    const FusedRun got =
        run_fused(hidden, weight, layout, targets, copt, {.fused = fo, .grads = grads});
    FusedOptions plain;
    plain.entropy = true;
    const FusedRun full =
        run_fused(hidden, weight, layout, targets, copt, {.fused = plain, .grads = grads});
    FusedOptions kept = plain;
    const std::vector<int64_t> all_kept = with_targets_kept(kept_ids, width, targets);
    kept.kept.ids = all_kept;
    kept.kept.width = width;
    const FusedRun restricted =
        run_fused(hidden, weight, layout, targets, copt, {.fused = kept, .grads = grads});
    FusedOptions given = plain;
    given.kept.ids = kept_ids;
    given.kept.width = width;
    given.kept.empty_rows = EmptyKeptRow::full_vocabulary;
    const FusedRun given_run =
        run_fused(hidden, weight, layout, targets, copt, {.fused = given, .grads = grads});
    for (std::size_t rank = 0; rank < got.ranks.size(); ++rank) {
      const FusedLogprobResult& g = got.ranks[rank];
      EXPECT_EQ(g.kept_ids, kept_ids) << name;
      for (int64_t r = 0; r < kRows; ++r) {
        const std::string what =
            name + " rank " + std::to_string(rank) + " row " + std::to_string(r);
        const FusedRun& want = unrestricted(r) ? full : restricted;
        const auto i = static_cast<std::size_t>(r);
        EXPECT_EQ(canon::bits_of(g.logp[i]), canon::bits_of(want.ranks[rank].logp[i])) << what;
        EXPECT_EQ(canon::bits_of(g.lse[i]), canon::bits_of(want.ranks[rank].lse[i])) << what;
        EXPECT_EQ(canon::bits_of(g.entropy[i]), canon::bits_of(want.ranks[rank].entropy[i]))
            << what;
        for (int64_t h = 0; h < hs; ++h) {
          const auto at = static_cast<std::size_t>(r * hs + h);
          ASSERT_EQ(canon::bits_of(got.grad_hidden[rank][at]),
                    canon::bits_of(want.grad_hidden[rank][at]))
              << what << " grad_hidden " << h;
        }
      }
      EXPECT_EQ(bits(g.logp), bits(given_run.ranks[rank].logp)) << name << " given";
      EXPECT_EQ(bits(g.entropy), bits(given_run.ranks[rank].entropy)) << name << " given";
      EXPECT_EQ(bits(got.grad_hidden[rank]), bits(given_run.grad_hidden[rank])) << name;
    }
    EXPECT_EQ(bits(got.grad_weight), bits(given_run.grad_weight)) << name << " given";
    if (first) {
      EXPECT_EQ(bits(got.ranks[0].logp), bits(first->ranks[0].logp)) << name << " vs TP 1";
      EXPECT_EQ(bits(got.ranks[0].entropy), bits(first->ranks[0].entropy)) << name << " vs TP 1";
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

TEST(MixedKeptRows, AnEmptyActiveRowFailsOnEveryRankWithoutTheOptIn) {
  const Layout layout = vllm_layout(kReal, 2);
  const FullLogits logits = make_logits(DType::fp32, kRows, kReal, layout.padded, 31, 3.0f);
  const VocabParallelLogprob op(simd_kernels(), "test");
  std::vector<int64_t> ids(kRows * 2, -1);
  std::vector<int64_t> targets(kRows, 0);
  for (int64_t r = 0; r < kRows; ++r) {
    if (r != 3) ids[static_cast<std::size_t>(r * 2)] = 0;
  }
  const RankErrors e = rank_errors(2, [&](Communicator& comm) {
    const int r = comm.rank();
    const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
    ForwardOptions o;
    o.kept.ids = ids;
    o.kept.width = 2;
    // Ranks that disagree on the mode fail together too: rank 1 opts in, rank 0 does not.
    if (r == 1) o.kept.empty_rows = EmptyKeptRow::full_vocabulary;
    (void)op.forward(logits.shard(b.start, b.end), targets, make_contract(layout, r, kRows, {}),
                     comm, o);
  });
  ASSERT_TRUE(e.finished);
  EXPECT_THAT(e.errors[0], HasSubstr("kept_ids row 3 is an active row with no kept id"));
  EXPECT_THAT(e.errors[0], HasSubstr("empty_kept=full"));
  EXPECT_FALSE(e.errors[1].empty());
}

}  // namespace
}  // namespace detlogp::testing
