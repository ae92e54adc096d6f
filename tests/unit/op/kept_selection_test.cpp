// Recomputed kept sets (op/kept_selection, kernels/cpu/select): each row's top-k / top-p set of
// the scored logits, against a float64 brute-force oracle of the rule (docs/numerics.md
// "Recomputed kept sets (top-k, top-p)"): exact set equality on generic data (fp32 and bf16,
// whose many equal values exercise the id tie rule), with a softcap and per-row temperatures;
// the same ids on every rank and at TP 1..8 with even, padded and uneven shards, for permuted
// rows, a row alone, every SIMD target and thread count of the forward that gives the full
// LSE, and from the fused lm_head's block scan; the boundary cases written out (mass exactly at
// top_p, all-equal logits, top_k = 1, top_p = 1, top_k >= the real vocabulary, NaN and -inf
// logits, the 1024-id cap); bad parameters and ranks that disagree fail on every rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <tuple>

#include "detlogp/fused.hpp"
#include "fused_test_util.hpp"
#include "op/kept_selection.hpp"
#include "op/preflight.hpp"
#include "op/preflight_record.hpp"
#include "op/vocab_layout.hpp"
#include "op_test_util.hpp"
#include "tp_compare.hpp"

namespace detlogp::testing {
namespace {

using ::testing::HasSubstr;

struct Params {
  std::vector<int32_t> top_k;
  std::vector<float> top_p;
  op::KeptSelectionParams view() const { return {.top_k = top_k, .top_p = top_p}; }
};

// Rows of one (top_k, top_p) each, cycling through `cases`.
Params params_for(int64_t rows, const std::vector<std::pair<int32_t, float>>& cases) {
  Params p;
  for (int64_t i = 0; i < rows; ++i) {
    const auto& c = cases[static_cast<std::size_t>(i) % cases.size()];
    p.top_k.push_back(c.first);
    p.top_p.push_back(c.second);
  }
  return p;
}

const std::vector<std::pair<int32_t, float>> kCases = {
    {0, 1.0f},     {1, 1.0f},  {50, 1.0f}, {0, 0.9f},    {0, 0.5f},   {40, 0.8f},
    {1024, 0.95f}, {0, 0.97f}, {5, 0.3f},  {200, 1e-6f}, {7, 0.999f}, {0, 0.25f}};

// The rule in float64, from the row's scored values z (real columns): rank by (z desc, id asc),
// top-k = the first k, then top-p over them with probabilities exp(z - LSE) relative to the
// top-k set (or the whole row), the mass before a token accumulated in ranking order; a token
// is kept iff that mass is < top_p. Empty for an unrestricted row.
std::vector<int64_t> oracle_row(const std::vector<float>& z, int32_t k, float p) {
  if (k == 0 && p == 1.0f) return {};
  std::vector<int64_t> order(z.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return z[a] != z[b] ? z[a] > z[b] : a < b; });
  std::size_t n = k > 0 ? std::min<std::size_t>(static_cast<std::size_t>(k), z.size()) : z.size();
  if (p < 1.0f) {
    double m = -std::numeric_limits<double>::infinity();
    for (std::size_t j = 0; j < n; ++j) m = std::max(m, static_cast<double>(z[order[j]]));
    double s = 0.0;
    for (std::size_t j = 0; j < n; ++j) s += std::exp(static_cast<double>(z[order[j]]) - m);
    const double lse = m + std::log(s);
    double d = 0.0;
    std::size_t kept = 0;
    for (std::size_t j = 0; j < n && d < static_cast<double>(p); ++j, ++kept) {
      d += std::exp(static_cast<double>(z[order[j]]) - lse);
    }
    n = kept;
  }
  std::vector<int64_t> ids(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n));
  std::sort(ids.begin(), ids.end());
  return ids;
}

// Row r's scored values over the real columns, as the canon computes them.
std::vector<float> scored_row(const FullLogits& m, int64_t r, int64_t real, float cap, float tau) {
  std::vector<float> z(static_cast<std::size_t>(real));
  for (int64_t c = 0; c < real; ++c) z[c] = canon::scored_logit(m.at(r, c), cap, tau);
  return z;
}

// Row r's ids of a selection, without the padding.
std::vector<int64_t> row_ids(const op::KeptSelection& s, int64_t r) {
  std::vector<int64_t> ids;
  for (int64_t j = 0; j < s.width; ++j) {
    const int64_t id = s.ids[static_cast<std::size_t>(r * s.width + j)];
    if (id >= 0) ids.push_back(id);
  }
  return ids;
}

struct SelectOptions {
  ContractOptions contract = {};
  std::vector<float> row_temperature = {};
  int threads = 0;
};

// The selection on every rank of a TP group: the forward (its LSE for top-p-only rows), the
// preflight with the parameters, the selection. Every rank must return the same ids.
op::KeptSelection select_tp(const ShardKernels& kernels, const FullLogits& logits,
                            const Layout& layout, const Params& params,
                            const SelectOptions& o = {}) {
  const VocabParallelLogprob op(kernels, "test");
  const int tp = static_cast<int>(layout.bounds.size());
  std::vector<op::KeptSelection> got(static_cast<std::size_t>(tp));
  run_ranks(tp, [&](Communicator& comm) {
    const int r = comm.rank();
    const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
    const LogprobContract c = make_contract(layout, r, logits.rows, o.contract);
    const LogitsView shard = logits.shard(b.start, b.end);
    const std::vector<int64_t> targets(static_cast<std::size_t>(logits.rows), 0);
    ForwardOptions fopt;
    fopt.exec.threads = o.threads;
    fopt.row_temperature = o.row_temperature;
    const LogprobResult fwd = op.forward(shard, targets, c, comm, fopt);
    op::PreflightFacts facts = op::call_facts(op::kForwardPhase, c, "test", false, logits.rows);
    facts.top_k = params.top_k;
    facts.top_p = params.top_p;
    op::check_then_preflight(comm, tp, facts,
                             [&] { op::check_kept_selection(params.view(), logits.rows); });
    got[static_cast<std::size_t>(r)] = op::select_kept_sets_of_logits(
        comm, kernels, c, shard, o.row_temperature, params.view(), fwd.lse, fopt.exec);
  });
  for (int r = 1; r < tp; ++r) {
    EXPECT_EQ(got[static_cast<std::size_t>(r)].ids, got[0].ids) << "rank " << r;
    EXPECT_EQ(got[static_cast<std::size_t>(r)].width, got[0].width) << "rank " << r;
  }
  return got[0];
}

void expect_oracle(const op::KeptSelection& got, const FullLogits& logits, int64_t real,
                   const Params& params, float cap, const std::vector<float>& temps,
                   const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(got.ids.size()), logits.rows * got.width) << what;
  int64_t widest = 0;
  for (int64_t r = 0; r < logits.rows; ++r) {
    const float tau = temps.empty() ? 1.0f : temps[static_cast<std::size_t>(r)];
    const std::vector<int64_t> want =
        oracle_row(scored_row(logits, r, real, cap, tau), params.top_k[r], params.top_p[r]);
    ASSERT_LE(want.size(), 1024u) << what << " row " << r << ": a case needs the cap";
    EXPECT_EQ(row_ids(got, r), want) << what << " row " << r;
    // Ascending, then -1 padding.
    for (int64_t j = static_cast<int64_t>(want.size()); j < got.width; ++j) {
      EXPECT_EQ(got.ids[static_cast<std::size_t>(r * got.width + j)], -1) << what;
    }
    widest = std::max<int64_t>(widest, static_cast<int64_t>(want.size()));
  }
  EXPECT_EQ(got.width, widest) << what;
}

// Every layout: TP 1, Megatron's padded even shards at TP 2..8, uneven tile-aligned shards.
std::vector<std::pair<std::string, Layout>> layouts_of(int64_t real) {
  std::vector<std::pair<std::string, Layout>> out;
  out.push_back({"TP 1", Layout{real, real, {{0, real}}}});
  for (int tp = 2; tp <= 8; ++tp) {
    const VocabLayout ml = megatron_bounds(real, tp);
    out.push_back({"TP " + std::to_string(tp) + " even",
                   Layout{real, ml.padded_vocab_size, ml.vocab_shard_bounds}});
  }
  out.push_back({"TP 3 uneven", uneven_layout(real, {3, 11, 10}, 128)});
  out.push_back({"TP 4 uneven", uneven_layout(real, {1, 2, 17, 4}, 128)});
  // The last rank holds padding only (tiles past the real vocabulary).
  const int64_t tiles = (real + 127) / 128;
  out.push_back({"TP 3 padding-only shard", uneven_layout(real, {tiles - 4, 4, 2}, 128)});
  return out;
}

TEST(KeptSelection, MatchesTheOracleAtEveryTpDegree) {
  const int64_t real = 3000, rows = 24;
  const Params params = params_for(rows, kCases);
  const ShardKernels& op = simd_kernels();
  for (DType dtype : {DType::fp32, DType::bf16}) {
    for (const auto& [name, layout] : layouts_of(real)) {
      const FullLogits logits = make_logits(dtype, rows, real, layout.padded, 11, 3.0f, 1e4f);
      const std::string what = name + (dtype == DType::fp32 ? " fp32" : " bf16");
      expect_oracle(select_tp(op, logits, layout, params, {.contract = {.dtype = dtype}}), logits,
                    real, params, 0.0f, {}, what);
    }
  }
}

TEST(KeptSelection, SoftcapAndPerRowTemperaturesScoreTheLogitsFirst) {
  const int64_t real = 2000, rows = 24;
  const Params params = params_for(rows, kCases);
  std::vector<float> temps(static_cast<std::size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) temps[i] = std::array{0.6f, 1.0f, 1.7f, 0.9f}[i % 4];
  const ShardKernels& op = simd_kernels();
  for (const auto& [name, layout] : layouts_of(real)) {
    const FullLogits logits = make_logits(DType::fp32, rows, real, layout.padded, 12, 6.0f);
    const SelectOptions o{.contract = {.softcap = 15.0f}, .row_temperature = temps};
    expect_oracle(select_tp(op, logits, layout, params, o), logits, real, params, 15.0f, temps,
                  name + " softcap 15, per-row temperatures");
  }
}

// The parameters of rows `order`, in that order.
Params take_params(const Params& p, const std::vector<int64_t>& order) {
  return Params{take(p.top_k, order), take(p.top_p, order)};
}

TEST(KeptSelection, ARowsSetDoesNotDependOnTheBatch) {
  const int64_t real = 1500, rows = 12;
  const Params params = params_for(rows, kCases);
  const Layout layout = uneven_layout(real, {5, 1, 6}, 128);
  const FullLogits logits = make_logits(DType::fp32, rows, real, layout.padded, 13);
  const ShardKernels& op = simd_kernels();
  const op::KeptSelection all = select_tp(op, logits, layout, params);
  std::vector<int64_t> order(static_cast<std::size_t>(rows));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::reverse(order.begin(), order.end());
  std::rotate(order.begin(), order.begin() + 5, order.end());
  const op::KeptSelection permuted =
      select_tp(op, take_rows(logits, order), layout, take_params(params, order));
  for (std::size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(row_ids(permuted, static_cast<int64_t>(i)), row_ids(all, order[i])) << "row " << i;
  }
  for (int64_t r : {int64_t{3}, int64_t{6}, int64_t{7}}) {
    const op::KeptSelection alone =
        select_tp(op, take_rows(logits, {r}), layout, take_params(params, {r}));
    EXPECT_EQ(row_ids(alone, 0), row_ids(all, r)) << "row " << r << " alone";
  }
}

TEST(KeptSelection, KernelsAndThreadsDoNotMatter) {
  const int64_t real = 2500, rows = 10;
  // Top-p without top-k on most rows: their probabilities use the forward's full LSE.
  const Params params = params_for(rows, {{0, 0.9f}, {0, 0.6f}, {3, 0.5f}, {0, 0.93f}});
  const Layout layout = padded_layout(real, 3, 128);
  const FullLogits logits = make_logits(DType::fp32, rows, real, layout.padded, 14, 2.0f);
  const ShardKernels& ref = reference_kernels();
  const op::KeptSelection want = select_tp(ref, logits, layout, params, {.threads = 1});
  expect_oracle(want, logits, real, params, 0.0f, {}, "reference");
  for (const std::string& t : simd_targets()) {
    const ShardKernels& op = simd_kernels_for(t);
    for (int threads : {1, 3}) {
      const op::KeptSelection got = select_tp(op, logits, layout, params, {.threads = threads});
      EXPECT_EQ(got.ids, want.ids) << t << " threads " << threads;
    }
  }
}

// A selection at TP 1 of explicit logits (rows of `real` columns, no padding).
op::KeptSelection select_rows(const std::vector<std::vector<float>>& rows_z, const Params& params,
                              int tp = 1) {
  const auto real = static_cast<int64_t>(rows_z[0].size());
  FullLogits m;
  m.rows = static_cast<int64_t>(rows_z.size());
  const Layout layout = tp == 1 ? Layout{real, real, {{0, real}}} : padded_layout(real, tp, 128);
  m.cols = layout.padded;
  for (const auto& row : rows_z) {
    m.f32.insert(m.f32.end(), row.begin(), row.end());
    m.f32.insert(m.f32.end(), static_cast<std::size_t>(layout.padded - real), 1e30f);
  }
  const ShardKernels& op = simd_kernels();
  return select_tp(op, m, layout, params,
                   {.contract = {.active = std::vector<bool>(rows_z.size(), false)}});
}

TEST(KeptSelection, ATopKSetsLseIsTheCanonsLseOfItsValuesAsAVocabulary) {
  for (int64_t n : {int64_t{1}, int64_t{127}, int64_t{128}, int64_t{700}, int64_t{1024}}) {
    const FullLogits row = make_logits(DType::fp32, 1, n, n, 51, 4.0f);
    const Layout layout{n, n, {{0, n}}};
    float want = 0.0f;
    run_ranks(1, [&](Communicator& comm) {
      const VocabParallelLogprob op(reference_kernels(), "test");
      want = op.forward(row.shard(0, n), std::vector<int64_t>{0}, make_contract(layout, 0, 1, {}),
                        comm, {})
                 .lse[0];
    });
    for (const ShardKernels* k : {&reference_kernels(), &simd_kernels()}) {
      EXPECT_EQ(canon::bits_of(op::kept_scores_lse(*k, row.f32)), canon::bits_of(want))
          << n << " " << k->name();
    }
  }
}

TEST(KeptSelection, TheTokenAtExactlyTopPMassIsDropped) {
  // Token j is kept iff the mass strictly before it is < top_p: with top_p equal to the first
  // token's probability the second is dropped; one ulp above, kept.
  const std::vector<float> z = {2.0f, 1.0f, 0.5f, -1.0f};
  const float lse =
      op::kept_scores_lse(reference_kernels(), z);  // the top-4 set is the whole row, ids ascending
  const float p0 = canon::det_exp(z[0] - lse);
  EXPECT_EQ(row_ids(select_rows({z}, {{4}, {p0}}), 0), (std::vector<int64_t>{0}));
  EXPECT_EQ(row_ids(select_rows({z}, {{4}, {std::nextafter(p0, 2.0f)}}), 0),
            (std::vector<int64_t>{0, 1}));
  // Without top-k, relative to the forward's full LSE (here the same row).
  EXPECT_EQ(row_ids(select_rows({z}, {{0}, {p0}}), 0), (std::vector<int64_t>{0}));
  // Any top_p > 0 keeps the top token.
  EXPECT_EQ(row_ids(select_rows({z}, {{0}, {1e-30f}}), 0), (std::vector<int64_t>{0}));
}

TEST(KeptSelection, TiesGoToTheLowerIdAndTopKKeepsExactlyK) {
  const std::vector<float> equal(300, 0.25f);
  for (int tp : {1, 3}) {
    const std::string what = "TP " + std::to_string(tp);
    EXPECT_EQ(row_ids(select_rows({equal}, {{3}, {1.0f}}, tp), 0), (std::vector<int64_t>{0, 1, 2}))
        << what;
    EXPECT_EQ(row_ids(select_rows({equal}, {{1}, {1.0f}}, tp), 0), (std::vector<int64_t>{0}))
        << what;
    // Top-p over equal probabilities 1/300: the ids from 0 up to the first whose mass before
    // reaches top_p (0.351: 105/300 before id 105 is below it, 106/300 before id 106 is not).
    std::vector<int64_t> first(106);
    std::iota(first.begin(), first.end(), int64_t{0});
    EXPECT_EQ(row_ids(select_rows({equal}, {{0}, {0.351f}}, tp), 0), first) << what;
    EXPECT_EQ(oracle_row(equal, 0, 0.351f), first);
  }
  // Ties at the k-th value: exactly k (vLLM would keep all four 5s).
  const std::vector<float> z = {5.0f, 1.0f, 5.0f, 7.0f, 5.0f, 5.0f};
  EXPECT_EQ(row_ids(select_rows({z}, {{3}, {1.0f}}), 0), (std::vector<int64_t>{0, 2, 3}));
}

TEST(KeptSelection, UnrestrictedRowsTopPOneAndTopKBeyondTheVocabulary) {
  std::vector<float> z(100);
  for (std::size_t i = 0; i < z.size(); ++i) z[i] = std::sin(static_cast<float>(i));
  std::vector<int64_t> all(100);
  std::iota(all.begin(), all.end(), int64_t{0});
  // top_k 0 and top_p 1: not restricted (no ids); a batch of such rows has width 0.
  const op::KeptSelection none = select_rows({z, z}, {{0, 0}, {1.0f, 1.0f}});
  EXPECT_EQ(none.width, 0);
  EXPECT_TRUE(none.ids.empty());
  const op::KeptSelection mixed = select_rows({z, z}, {{0, 7}, {1.0f, 1.0f}});
  EXPECT_EQ(mixed.width, 7);
  EXPECT_TRUE(row_ids(mixed, 0).empty());
  EXPECT_EQ(row_ids(mixed, 1), oracle_row(z, 7, 1.0f));
  // top_k >= the real vocabulary keeps every real column, with or without top_p 1.
  EXPECT_EQ(row_ids(select_rows({z}, {{100}, {1.0f}}), 0), all);
  EXPECT_EQ(row_ids(select_rows({z}, {{1000}, {1.0f}}), 0), all);
  EXPECT_EQ(row_ids(select_rows({z}, {{0}, {1.0f}}), 0), std::vector<int64_t>{});
}

TEST(KeptSelection, NanAndInfiniteLogitsAreRankedDeterministically) {
  std::vector<float> z(400, 0.0f);
  for (std::size_t i = 0; i < z.size(); ++i) z[i] = std::cos(0.37f * static_cast<float>(i));
  z[5] = -std::numeric_limits<float>::infinity();
  std::vector<float> with_nan = z;
  with_nan[333] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> most_neg_inf(400, -std::numeric_limits<float>::infinity());
  most_neg_inf[250] = 1.0f;
  most_neg_inf[17] = 0.0f;
  const Params params{{3, 3, 4}, {1.0f, 1.0f, 0.9f}};
  op::KeptSelection want;
  for (int tp : {1, 2, 3}) {
    const op::KeptSelection got = select_rows({with_nan, most_neg_inf, most_neg_inf}, params, tp);
    if (tp == 1) want = got;
    EXPECT_EQ(got.ids, want.ids) << "TP " << tp;
  }
  // A NaN ranks first; -inf columns come last, by id.
  std::vector<float> without = z;
  without[333] = -std::numeric_limits<float>::infinity();
  std::vector<int64_t> nan_row = oracle_row(without, 2, 1.0f);
  nan_row.push_back(333);
  std::sort(nan_row.begin(), nan_row.end());
  EXPECT_EQ(row_ids(want, 0), nan_row);
  EXPECT_EQ(row_ids(want, 1), (std::vector<int64_t>{0, 17, 250}));
  EXPECT_EQ(row_ids(want, 2), (std::vector<int64_t>{17, 250}));
}

TEST(KeptSelection, ATopPSetOfMoreThan1024IdsIsAnErrorOnEveryRank) {
  const std::vector<float> equal(3000, 1.0f);
  const Layout layout = padded_layout(3000, 2, 128);
  FullLogits m;
  m.rows = 2;
  m.cols = layout.padded;
  for (int i = 0; i < 2; ++i) {
    m.f32.insert(m.f32.end(), equal.begin(), equal.end());
    m.f32.insert(m.f32.end(), static_cast<std::size_t>(layout.padded - 3000), 0.0f);
  }
  const VocabParallelLogprob op(simd_kernels(), "test");
  const Params params{{0, 0}, {0.2f, 0.5f}};
  const RankErrors e = rank_errors(2, [&](Communicator& comm) {
    const int r = comm.rank();
    const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
    const LogprobContract c = make_contract(layout, r, m.rows, {});
    const LogitsView shard = m.shard(b.start, b.end);
    const LogprobResult fwd = op.forward(shard, std::vector<int64_t>{0, 0}, c, comm, {});
    try {
      (void)op::select_kept_sets_of_logits(comm, simd_kernels(), c, shard, {}, params.view(),
                                           fwd.lse);
    } catch (const ContractError& err) {
      EXPECT_EQ(err.code(), ErrorCode::out_of_range);
      EXPECT_EQ(err.field(), "top_p");
      throw;
    }
  });
  ASSERT_TRUE(e.finished);
  for (const std::string& msg : e.errors) {
    EXPECT_THAT(msg, HasSubstr("top_p of row 1 is 0.5"));
    EXPECT_THAT(msg, HasSubstr("more than 1024 ids"));
    EXPECT_THAT(msg, HasSubstr("pass top_k <= 1024"));
  }
  // Capped by top_k = 1024: the rule over the 1024 lowest ids.
  const op::KeptSelection capped =
      select_tp(simd_kernels(), m, layout, {{1024, 1024}, {0.2f, 0.5f}});
  const std::vector<float> first(1024, 1.0f);
  const float p = canon::det_exp(1.0f - op::kept_scores_lse(reference_kernels(), first));
  for (int64_t r = 0; r < 2; ++r) {
    const double top_p = r == 0 ? 0.2 : 0.5;
    int64_t n = 0;
    for (double d = 0.0; d < static_cast<double>(static_cast<float>(top_p)); d += p) ++n;
    std::vector<int64_t> want(static_cast<std::size_t>(n));
    std::iota(want.begin(), want.end(), int64_t{0});
    EXPECT_EQ(row_ids(capped, r), want) << "row " << r;
  }
}

TEST(KeptSelection, TheFusedScanFindsTheLogitsOpsSets) {
  const int64_t real = 1300, hs = 40, rows = 12;
  const Params params = params_for(rows, kCases);
  std::vector<float> temps(static_cast<std::size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) temps[i] = i % 3 == 0 ? 1.0f : 0.8f;
  for (const Layout& layout :
       {Layout{real, real, {{0, real}}}, uneven_layout(real, {6, 1, 4}, 128)}) {
    const int tp = static_cast<int>(layout.bounds.size());
    const FullLogits hidden = make_matrix(DType::bf16, rows, hs, 21, 1.0f);
    const FullLogits weight = make_logits(DType::bf16, layout.padded, hs, hs, 22, 0.5f, 0.0f);
    const ContractOptions copt{.dtype = DType::bf16, .softcap = 20.0f};
    std::vector<op::KeptSelection> got(static_cast<std::size_t>(tp));
    const FusedLinearLogprob fop;
    const FusedKernels& kernels = fused_kernels_for("");
    run_ranks(tp, [&](Communicator& comm) {
      const int r = comm.rank();
      const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
      const LogprobContract c = make_contract(layout, r, rows, copt);
      FusedOptions fo;
      fo.row_temperature = temps;
      const FusedLogprobResult fwd = fop.forward(whole(hidden), row_range(weight, b.start, b.end),
                                                 std::vector<int64_t>(rows, 0), c, comm, fo);
      const FusedShard shard{.hidden = whole(hidden),
                             .weight = row_range(weight, b.start, b.end),
                             .vocab_start = b.start,
                             .geometry = op::tile_geometry(c),
                             .softcap = 20.0f,
                             .row_temperature = temps};
      got[static_cast<std::size_t>(r)] = op::select_kept_sets_of_fused(
          comm, kernels, shard, params.view(), fwd.lse, {.threads = 1});
      const op::KeptSelection threaded = op::select_kept_sets_of_fused(
          comm, kernels, shard, params.view(), fwd.lse, {.threads = 3});
      EXPECT_EQ(threaded.ids, got[static_cast<std::size_t>(r)].ids) << "3 threads";
    });
    // The logits operator on the canonical logits with the same scoring.
    const FullLogits z = logits_of(hidden, weight);
    const op::KeptSelection want =
        select_tp(simd_kernels(), z, layout, params,
                  {.contract = {.softcap = 20.0f}, .row_temperature = temps});
    for (int r = 0; r < tp; ++r) {
      EXPECT_EQ(got[static_cast<std::size_t>(r)].ids, want.ids) << "TP " << tp << " rank " << r;
    }
    expect_oracle(want, z, real, params, 20.0f, temps, "fused TP " + std::to_string(tp));
  }
}

TEST(KeptSelection, BothScansGiveTheFirstOfTheFullRanking) {
  // Values with many ties (a few distinct levels), -0 and +0, NaNs and infinities, offered in
  // a shuffled order; every count from 0 to beyond the stream's length.
  std::mt19937 gen(41);
  const float levels[] = {0.5f,
                          -0.0f,
                          0.0f,
                          3.0f,
                          -1.0f,
                          3.0f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()};
  std::vector<kernels::Candidate> stream;
  for (int32_t id = 0; id < 3000; ++id) {
    const float z = id % 5 == 0 ? std::normal_distribution<float>(0.0f, 2.0f)(gen)
                                : levels[gen() % std::size(levels)];
    stream.push_back({.id = id, .z = z});
  }
  std::shuffle(stream.begin(), stream.end(), gen);
  std::vector<kernels::Candidate> sorted = stream;
  std::sort(sorted.begin(), sorted.end(), kernels::ranks_before);
  for (std::size_t count : {0u, 1u, 2u, 7u, 100u, 1024u, 2999u, 3000u, 5000u}) {
    kernels::TopCandidates top(count);
    for (const kernels::Candidate& c : stream) top.offer(c);
    const std::vector<kernels::Candidate>& got = top.ranked();
    ASSERT_EQ(got.size(), std::min<std::size_t>(count, stream.size())) << count;
    for (std::size_t j = 0; j < got.size(); ++j) {
      EXPECT_EQ(got[j].id, sorted[j].id) << "count " << count << " position " << j;
    }
    // The two-pass scan of a whole row (ids = positions + an offset).
    std::vector<float> z(stream.size());
    for (const kernels::Candidate& c : stream) z[static_cast<std::size_t>(c.id)] = c.z;
    std::vector<kernels::Candidate> first;
    std::vector<uint32_t> hist;
    kernels::first_of_values(z, 1000, count, first, hist);
    ASSERT_EQ(first.size(), got.size()) << count;
    for (std::size_t j = 0; j < got.size(); ++j) {
      EXPECT_EQ(first[j].id, sorted[j].id + 1000) << "count " << count << " position " << j;
    }
  }
}

TEST(KeptSelection, BadParametersNameTheRowValueAndFix) {
  auto error_of = [](const Params& p, int64_t rows) {
    try {
      op::check_kept_selection(p.view(), rows);
    } catch (const ContractError& e) {
      return std::make_tuple(e.code(), e.field(), std::string(e.what()));
    }
    return std::make_tuple(ErrorCode::unspecified, std::string(), std::string());
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Bad {
    Params p;
    ErrorCode code;
    std::string field, text;
  };
  const std::vector<Bad> bad = {
      {{{1, 2}, {}}, ErrorCode::wrong_shape, "top_k", "top_k has 2 entries but there are 3 rows"},
      {{{}, {0.5f}}, ErrorCode::wrong_shape, "top_p", "top_p has 1 entries but there are 3 rows"},
      {{{1, -1, 2}, {}}, ErrorCode::out_of_range, "top_k", "top_k of row 1 is -1"},
      {{{1, 2, 1025}, {}}, ErrorCode::out_of_range, "top_k", "top_k of row 2 is 1025"},
      {{{}, {0.5f, 0.0f, 1.0f}}, ErrorCode::out_of_range, "top_p", "top_p of row 1 is 0"},
      {{{}, {1.5f, 0.5f, 1.0f}}, ErrorCode::out_of_range, "top_p", "top_p of row 0 is 1.5"},
      {{{}, {0.5f, 0.5f, nan}}, ErrorCode::out_of_range, "top_p", "top_p of row 2 is nan"},
      {{{}, {-0.25f, 0.5f, 1.0f}}, ErrorCode::out_of_range, "top_p", "must be a number in (0, 1]"},
  };
  for (const Bad& b : bad) {
    const auto [code, field, text] = error_of(b.p, 3);
    EXPECT_EQ(code, b.code) << b.text;
    EXPECT_EQ(field, b.field) << b.text;
    EXPECT_THAT(text, HasSubstr(b.text));
  }
  EXPECT_EQ(std::get<0>(error_of({{0, 1024, 1}, {1.0f, 1e-9f, 0.5f}}, 3)), ErrorCode::unspecified);
}

// The selection's call on `tp` ranks where rank 1 passes `other` instead of `params`.
RankErrors run_disagreeing(int tp, const Params& params, const Params& other) {
  const int64_t real = 600, rows = 3;
  const Layout layout = padded_layout(real, tp, 128);
  const FullLogits logits = make_logits(DType::fp32, rows, real, layout.padded, 31);
  return rank_errors(tp, [&](Communicator& comm) {
    const int r = comm.rank();
    const Params& mine = r == 1 ? other : params;
    const LogprobContract c = make_contract(layout, r, rows, {});
    op::PreflightFacts facts = op::call_facts(op::kForwardPhase, c, "test", false, rows);
    facts.top_k = mine.top_k;
    facts.top_p = mine.top_p;
    op::check_then_preflight(comm, tp, facts, [&] { op::check_kept_selection(mine.view(), rows); });
    const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
    const std::vector<float> lse(rows, 0.0f);
    (void)op::select_kept_sets_of_logits(comm, simd_kernels(), c, logits.shard(b.start, b.end), {},
                                         mine.view(), lse);
  });
}

TEST(KeptSelection, RanksThatDisagreeOrFailLocallyFailTogether) {
  const Params params{{5, 0, 2}, {1.0f, 0.9f, 0.5f}};
  struct Case {
    Params other;
    std::string text;
  };
  const std::vector<Case> cases = {
      {{{5, 0, 3}, {1.0f, 0.9f, 0.5f}}, "top_k values"},
      {{{5, 0, 2}, {1.0f, 0.9f, 0.6f}}, "top_p values"},
      {{{}, {1.0f, 0.9f, 0.5f}}, "top_k values"},
      {{{5, 0, 2}, {1.0f, 2.0f, 0.5f}}, "top_p of row 1 is 2"},
  };
  for (const Case& k : cases) {
    const RankErrors e = run_disagreeing(3, params, k.other);
    ASSERT_TRUE(e.finished) << k.text;
    for (std::size_t r = 0; r < e.errors.size(); ++r) {
      EXPECT_THAT(e.errors[r], HasSubstr(k.text)) << "rank " << r;
    }
  }
  const RankErrors ok = run_disagreeing(3, params, params);
  ASSERT_TRUE(ok.finished);
  for (const std::string& msg : ok.errors) EXPECT_EQ(msg, "");
}

TEST(KeptSelection, PreflightDigestsOfTheParameters) {
  const std::vector<int32_t> k = {1, 2, 3};
  const std::vector<float> p = {0.5f, 1.0f, 0.9f};
  EXPECT_EQ(op::top_k_digest({}), "");
  EXPECT_EQ(op::top_p_digest({}), "");
  EXPECT_EQ(op::top_k_digest(k).size(), 32u);
  EXPECT_NE(op::top_k_digest(k), op::top_k_digest(std::vector<int32_t>{1, 3, 2}));
  EXPECT_NE(op::top_p_digest(p), op::top_p_digest(std::vector<float>{0.5f, 1.0f, 0.8999f}));
}

}  // namespace
}  // namespace detlogp::testing
