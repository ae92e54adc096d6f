// The sampler (detlogp/sampler.hpp, docs/numerics.md "Sampling"): Philox4x32-10 against the
// published known answers, the uniform and the Gumbel noise over every generator output; the
// tokens and every output the same bits at TP 1 .. 8 with vLLM's unaligned bounds, Megatron's
// and uneven ones, ranks with no columns or only padding, whatever the batch composition, row
// order, thread count and kernels; the token the draw's scalar definition gives (every key
// computed, no skipping); logp and full_logp bitwise the operator's forward of the tokens (kept
// sets recomputed, or the full vocabulary), top-N the ranking's first ids with the operator's logp;
// greedy rows; inactive rows (+0, as the operator); tokens inside their kept sets; frequencies over
// many positions that match softmax(z) (with temperature and top-k); bad inputs and disagreeing
// ranks fail on every rank, never hang.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>

#include "detlogp/sampler.hpp"
#include "fused_test_util.hpp"
#include "numerics/philox.hpp"
#include "tp_compare.hpp"

namespace detlogp::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kReal = 1000;
constexpr int64_t kRows = 12;

std::vector<std::pair<std::string, Layout>> layouts() {
  std::vector<std::pair<std::string, Layout>> out = {{"TP 1", Layout{kReal, kReal, {{0, kReal}}}}};
  for (int64_t tp : {2, 3, 4, 5, 7, 8}) {
    out.push_back({"vLLM TP " + std::to_string(tp), vllm_layout(kReal, tp)});
  }
  out.push_back({"Megatron TP 2", padded_layout(kReal, 2, 128)});
  out.push_back({"Megatron TP 4", padded_layout(kReal, 4, 128)});
  out.push_back({"uneven TP 3", uneven_layout(kReal, {1, 5, 2}, 128)});
  // A rank with no columns, a rank holding one real column and padding; a rank of padding only.
  out.push_back(
      {"empty rank TP 4", Layout{kReal, 1024, {{0, 0}, {0, 500}, {500, 999}, {999, 1024}}}});
  out.push_back({"padding rank TP 2", Layout{kReal, 1024, {{0, 1000}, {1000, 1024}}}});
  return out;
}

// Mixed rows: unrestricted, top-k, top-p, both; some greedy, some with their own temperature.
struct Rows {
  std::vector<int64_t> seeds, positions;
  std::vector<float> temperature;
  std::vector<int32_t> top_k;
  std::vector<float> top_p;
};

Rows mixed_rows() {
  Rows p;
  for (int64_t r = 0; r < kRows; ++r) {
    p.seeds.push_back(r % 3 == 0 ? -7 : 1000003 * r + 11);  // a negative seed: its bits
    p.positions.push_back(r * 37 + (int64_t{1} << 33) * (r % 2));
  }
  p.temperature = {1.0f, 0.7f, 0.0f, 1.3f, 1.0f, 0.5f, 0.0f, 2.0f, 1.0f, 0.9f, 1.1f, 0.0f};
  p.top_k = {0, 50, 0, 0, 5, 0, 3, 0, 200, 1, 0, 20};
  p.top_p = {1.0f, 1.0f, 0.9f, 1.0f, 0.8f, 0.3f, 1.0f, 0.95f, 1.0f, 1.0f, 1.0f, 0.5f};
  return p;
}

SampleOptions options_of(const Rows& p, int64_t num_logprobs = 0) {
  return {.seeds = p.seeds,
          .positions = p.positions,
          .temperature = p.temperature,
          .top_k = p.top_k,
          .top_p = p.top_p,
          .num_logprobs = num_logprobs};
}

Rows take_rows_of(const Rows& p, const std::vector<int64_t>& order) {
  return {take(p.seeds, order), take(p.positions, order), take(p.temperature, order),
          take(p.top_k, order), take(p.top_p, order)};
}

// Every rank's result of one sample() over an in-process group.
std::vector<SampleResult> run_sample(const LogprobOp& op, const FullLogits& logits,
                                     const Layout& layout, const ContractOptions& copt,
                                     const SampleOptions& so) {
  const int tp = static_cast<int>(layout.bounds.size());
  std::vector<SampleResult> out(static_cast<std::size_t>(tp));
  run_ranks(tp, [&](Communicator& comm) {
    const int r = comm.rank();
    const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
    const LogprobContract c = make_contract(layout, r, logits.rows, copt);
    out[static_cast<std::size_t>(r)] = sample(op, logits.shard(b.start, b.end), c, comm, so);
  });
  return out;
}

void expect_same(const SampleResult& a, const SampleResult& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what << ": tokens";
  EXPECT_EQ(bits(a.logp), bits(b.logp)) << what << ": logp";
  EXPECT_EQ(bits(a.full_logp), bits(b.full_logp)) << what << ": full_logp";
  EXPECT_EQ(a.kept_width, b.kept_width) << what << ": kept width";
  EXPECT_EQ(a.kept_ids, b.kept_ids) << what << ": kept ids";
  EXPECT_EQ(a.top_ids, b.top_ids) << what << ": top ids";
  EXPECT_EQ(bits(a.top_logp), bits(b.top_logp)) << what << ": top logp";
}

// Row i of `a` against row j of `b` (every field of the row).
void expect_row_same(const SampleResult& a, int64_t i, const SampleResult& b, int64_t j,
                     const std::string& what) {
  const auto ui = static_cast<std::size_t>(i), uj = static_cast<std::size_t>(j);
  EXPECT_EQ(a.tokens[ui], b.tokens[uj]) << what << " row " << i;
  EXPECT_EQ(canon::bits_of(a.logp[ui]), canon::bits_of(b.logp[uj])) << what << " row " << i;
  EXPECT_EQ(canon::bits_of(a.full_logp[ui]), canon::bits_of(b.full_logp[uj])) << what;
  auto kept_row = [](const SampleResult& s, std::size_t r) {
    std::vector<int64_t> ids;
    for (int64_t k = 0; k < s.kept_width; ++k) {
      const int64_t id = s.kept_ids[r * static_cast<std::size_t>(s.kept_width) + k];
      if (id >= 0) ids.push_back(id);
    }
    return ids;
  };
  EXPECT_EQ(kept_row(a, ui), kept_row(b, uj)) << what << " kept row " << i;
  const auto n = static_cast<std::size_t>(a.num_logprobs);
  for (std::size_t k = 0; k < n; ++k) {
    EXPECT_EQ(a.top_ids[ui * n + k], b.top_ids[uj * n + k]) << what << " top row " << i;
    EXPECT_EQ(canon::bits_of(a.top_logp[ui * n + k]), canon::bits_of(b.top_logp[uj * n + k]));
  }
}

// z of row r, column c, as the canon scores it.
float z_of(const FullLogits& m, int64_t r, int64_t c, float tau, float cap = 0.0f) {
  return canon::canonicalize(canon::scored_logit(m.at(r, c), cap, tau));
}

TEST(Philox, KnownAnswersOfThePublishedVectors) {
  // Random123's known-answer vectors of philox4x32 with 10 rounds: counter, key, output.
  struct Kat {
    canon::Philox4x32 ctr;
    uint32_t k0, k1;
    canon::Philox4x32 want;
  };
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       0xffffffff,
       0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       0xa4093822,
       0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Kat& k : kats) {
    const canon::Philox4x32 got = canon::philox4x32_10(k.ctr, k.k0, k.k1);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(got.v[w], k.want.v[w]) << "word " << w;
  }
  // The sampler's key and counter layout: key (seed lo, seed hi), counter (position lo,
  // position hi, id, 0), word 0.
  const uint64_t seed = 0x299f31d0a4093822ULL, position = 0x85a308d3243f6a88ULL;
  const canon::Philox4x32 direct =
      canon::philox4x32_10({{0x243f6a88, 0x85a308d3, 77, 0}}, 0xa4093822, 0x299f31d0);
  EXPECT_EQ(canon::sample_uniform(seed, position, 77),
            static_cast<float>(2u * (direct.v[0] >> 9) + 1u) / 16777216.0f);
}

TEST(Philox, EveryUniformIsInsideZeroOneAndItsNoiseNondecreasingWithinTheBounds) {
  // Every value the generator's word can give: x >> 9 takes all 2^23 values.
  // The noise is nondecreasing in x >> 9 (the scan's bucket bounds rely on it).
  float lo = canon::kInf, hi = -canon::kInf, last = -canon::kInf;
  for (uint32_t m = 0; m < (1u << 23); ++m) {
    const float u = canon::uniform_of_word(m << 9 | (m & 0x1ff));
    ASSERT_EQ(u, static_cast<float>(2u * m + 1u) * 5.9604644775390625e-8f);
    ASSERT_GT(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    const float noise = canon::gumbel_key(0.0f, u);  // -det_log(-det_log(u))
    ASSERT_TRUE(std::isfinite(noise)) << "u = " << u;
    ASSERT_GE(noise, last) << "u = " << u;
    last = noise;
    lo = std::min(lo, noise);
    hi = std::max(hi, noise);
  }
  EXPECT_GE(lo, canon::kGumbelNoiseMin);
  EXPECT_LE(hi, canon::kGumbelNoiseMax);
  EXPECT_NEAR(lo, -std::log(-std::log(5.9604644775390625e-8)), 1e-4);
  EXPECT_NEAR(hi, 16.635, 1e-2);
}

TEST(Sampler, EveryOutputIsTheSameBitsAtEveryLayout) {
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const Rows rows = mixed_rows();
  for (DType dtype : {DType::fp32, DType::bf16}) {
    for (std::optional<float> cap : {std::optional<float>{}, std::optional<float>{30.0f}}) {
      const FullLogits base = make_logits(dtype, kRows, kReal, kReal, 5, 3.0f);
      const ContractOptions copt{.dtype = dtype, .softcap = cap};
      const SampleResult want =
          run_sample(op, base, layouts()[0].second, copt, options_of(rows, 5))[0];
      ASSERT_GT(want.kept_width, 0);
      for (const auto& [name, layout] : layouts()) {
        FullLogits logits = make_logits(dtype, kRows, kReal, layout.padded, 5, 3.0f);
        const auto got = run_sample(op, logits, layout, copt, options_of(rows, 5));
        for (const SampleResult& r : got) expect_same(want, r, name);
      }
    }
  }
}

TEST(Sampler, TheTokenIsTheDrawOfItsScalarDefinition) {
  // Every key of the row's kept set (or real vocabulary) computed, the largest taken, ties to
  // the lower id: what the scan gives with its skipping of ids that cannot win.
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const Rows rows = mixed_rows();
  for (float scale : {0.3f, 3.0f, 30.0f}) {
    const FullLogits logits = make_logits(DType::fp32, kRows, kReal, kReal, 9, scale);
    const SampleResult s = run_sample(op, logits, layouts()[0].second, {}, options_of(rows))[0];
    for (int64_t r = 0; r < kRows; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      const float t = rows.temperature[ur];
      std::vector<int64_t> ids;
      for (int64_t k = 0; k < s.kept_width; ++k) {
        const int64_t id = s.kept_ids[ur * static_cast<std::size_t>(s.kept_width) + k];
        if (id >= 0) ids.push_back(id);
      }
      if (ids.empty()) {
        ids.resize(kReal);
        std::iota(ids.begin(), ids.end(), 0);
      }
      int64_t best = -1;
      float best_key = 0.0f;
      for (int64_t id : ids) {
        const float z = z_of(logits, r, id, t == 0.0f ? 1.0f : t);
        const float key =
            t == 0.0f ? z
                      : canon::gumbel_key(
                            z, canon::sample_uniform(static_cast<uint64_t>(rows.seeds[ur]),
                                                     static_cast<uint64_t>(rows.positions[ur]),
                                                     static_cast<uint32_t>(id)));
        if (best < 0 || key > best_key) {
          best = id;
          best_key = key;
        }
      }
      EXPECT_EQ(s.tokens[ur], best) << "scale " << scale << " row " << r;
    }
  }
}

TEST(Sampler, LogpIsTheOperatorsForwardOfTheTokens) {
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const Rows rows = mixed_rows();
  const std::vector<float> tau = {1.0f, 0.7f, 1.0f, 1.3f, 1.0f, 0.5f,
                                  1.0f, 2.0f, 1.0f, 0.9f, 1.1f, 1.0f};  // greedy: 1
  for (const auto& [name, layout] : {layouts()[0], layouts()[3]}) {
    const FullLogits logits = make_logits(DType::bf16, kRows, kReal, layout.padded, 13, 3.0f);
    const ContractOptions copt{.dtype = DType::bf16};
    const SampleResult s = run_sample(op, logits, layout, copt, options_of(rows, 4))[0];
    // full_logp: the plain forward with targets = tokens, at the rows' temperatures.
    ForwardOptions plain;
    plain.row_temperature = tau;
    const TpRun full = run_tp(op, logits, layout, s.tokens, copt, plain, {});
    EXPECT_EQ(bits(s.full_logp), bits(full.ranks[0].result.logp)) << name;
    // logp of the restricted rows: the trainer's recomputed kept sets on those rows alone.
    std::vector<int64_t> restricted, free_rows;
    for (int64_t r = 0; r < kRows; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      (rows.top_k[ur] > 0 || rows.top_p[ur] < 1.0f ? restricted : free_rows).push_back(r);
    }
    ForwardOptions kept;
    const std::vector<float> sub_tau = take(tau, restricted);
    const std::vector<int32_t> sub_k = take(rows.top_k, restricted);
    const std::vector<float> sub_p = take(rows.top_p, restricted);
    kept.row_temperature = sub_tau;
    kept.kept.top_k = sub_k;
    kept.kept.top_p = sub_p;
    const TpRun trainer =
        run_tp(op, take_rows(logits, restricted), layout, take(s.tokens, restricted),
               ContractOptions{.dtype = DType::bf16}, kept, {});
    EXPECT_EQ(bits(take(s.logp, restricted)), bits(trainer.ranks[0].result.logp)) << name;
    for (std::size_t i = 0; i < restricted.size(); ++i) {
      const int64_t w = trainer.ranks[0].result.kept_width;
      std::vector<int64_t> want(trainer.ranks[0].result.kept_ids.begin() + i * w,
                                trainer.ranks[0].result.kept_ids.begin() + (i + 1) * w);
      want.erase(std::remove(want.begin(), want.end(), -1), want.end());
      std::vector<int64_t> got;
      for (int64_t k = 0; k < s.kept_width; ++k) {
        const int64_t id = s.kept_ids[restricted[i] * s.kept_width + k];
        if (id >= 0) got.push_back(id);
      }
      EXPECT_EQ(got, want) << name << " kept set of row " << restricted[i];
      EXPECT_TRUE(std::binary_search(got.begin(), got.end(), s.tokens[restricted[i]]));
    }
    for (int64_t r : free_rows) {
      EXPECT_EQ(canon::bits_of(s.logp[r]), canon::bits_of(s.full_logp[r])) << name;
      for (int64_t k = 0; k < s.kept_width; ++k) EXPECT_EQ(s.kept_ids[r * s.kept_width + k], -1);
    }
    // top-N: the ranking's first ids (z descending, id ascending) with the plain forward's logp.
    for (int64_t j = 0; j < s.num_logprobs; ++j) {
      std::vector<int64_t> ids;
      for (int64_t r = 0; r < kRows; ++r) ids.push_back(s.top_ids[r * s.num_logprobs + j]);
      const TpRun top = run_tp(op, logits, layout, ids, copt, plain, {});
      for (int64_t r = 0; r < kRows; ++r) {
        EXPECT_EQ(canon::bits_of(s.top_logp[r * s.num_logprobs + j]),
                  canon::bits_of(top.ranks[0].result.logp[r]))
            << name << " top " << j << " row " << r;
      }
    }
    for (int64_t r = 0; r < kRows; ++r) {
      std::vector<int64_t> order(kReal);
      std::iota(order.begin(), order.end(), 0);
      const float t = tau[static_cast<std::size_t>(r)];
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return z_of(logits, r, a, t) > z_of(logits, r, b, t);
      });
      for (int64_t j = 0; j < s.num_logprobs; ++j) {
        EXPECT_EQ(s.top_ids[r * s.num_logprobs + j], order[j]) << name << " row " << r;
      }
    }
  }
}

TEST(Sampler, ARowIsTheSameAloneInABatchAndInAnyOrder) {
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const Rows rows = mixed_rows();
  const Layout layout = vllm_layout(kReal, 3);
  const FullLogits logits = make_logits(DType::fp32, kRows, kReal, layout.padded, 21, 3.0f);
  const SampleResult batch = run_sample(op, logits, layout, {}, options_of(rows, 3))[0];
  for (int64_t r : {0, 2, 5, 11}) {  // unrestricted, top-p greedy, top-p, top-k greedy
    const Rows one = take_rows_of(rows, {r});
    const SampleResult alone =
        run_sample(op, take_rows(logits, {r}), layout, {}, options_of(one, 3))[0];
    expect_row_same(batch, r, alone, 0, "alone");
  }
  const std::vector<int64_t> order = {7, 3, 11, 0, 9, 1, 10, 2, 6, 4, 8, 5};
  const SampleResult permuted = run_sample(op, take_rows(logits, order), layout, {},
                                           options_of(take_rows_of(rows, order), 3))[0];
  for (std::size_t i = 0; i < order.size(); ++i) {
    expect_row_same(batch, order[i], permuted, static_cast<int64_t>(i), "permuted");
  }
}

TEST(Sampler, ThreadsAndKernelsDoNotChangeTheBits) {
  const VocabParallelLogprob simd(simd_kernels(), "test-simd");
  const VocabParallelLogprob ref(reference_kernels(), "test-reference");
  const Rows rows = mixed_rows();
  const Layout layout = vllm_layout(kReal, 2);
  const FullLogits logits = make_logits(DType::fp16, kRows, kReal, layout.padded, 3, 3.0f);
  const ContractOptions copt{.dtype = DType::fp16};
  SampleOptions one = options_of(rows, 2), two = options_of(rows, 2);
  one.exec.threads = 1;
  two.exec.threads = 2;
  const SampleResult a = run_sample(simd, logits, layout, copt, one)[0];
  expect_same(a, run_sample(simd, logits, layout, copt, two)[0], "2 threads");
  expect_same(a, run_sample(ref, logits, layout, copt, one)[0], "reference kernels");
  for (const std::string& target : simd_targets()) {
    const VocabParallelLogprob t(simd_kernels_for(target), "test-" + target);
    expect_same(a, run_sample(t, logits, layout, copt, two)[0], target);
  }
}

TEST(Sampler, InactiveRowsAreDrawnAndScoredZeroAsTheOperatorScoresThem) {
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const Rows rows = mixed_rows();
  const Layout layout = vllm_layout(kReal, 3);
  const FullLogits logits = make_logits(DType::fp32, kRows, kReal, layout.padded, 23, 3.0f);
  std::vector<bool> active(kRows, true);
  for (int64_t r : {1, 2, 7}) active[static_cast<std::size_t>(r)] = false;
  const SampleResult all = run_sample(op, logits, layout, {}, options_of(rows, 2))[0];
  const SampleResult some =
      run_sample(op, logits, layout, {.active = active}, options_of(rows, 2))[0];
  EXPECT_EQ(all.tokens, some.tokens);
  EXPECT_EQ(all.kept_ids, some.kept_ids);
  EXPECT_EQ(all.top_ids, some.top_ids);
  for (int64_t r = 0; r < kRows; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    const bool on = active[ur];
    EXPECT_EQ(canon::bits_of(some.logp[ur]), on ? canon::bits_of(all.logp[ur]) : 0u);
    EXPECT_EQ(canon::bits_of(some.full_logp[ur]), on ? canon::bits_of(all.full_logp[ur]) : 0u);
    EXPECT_EQ(canon::bits_of(some.top_logp[2 * ur]),
              on ? canon::bits_of(all.top_logp[2 * ur]) : 0u);
  }
}

TEST(Sampler, GreedyRowsTakeTheFirstOfTheRankingScoredAtTemperatureOne) {
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  // bf16 logits where rows 0 .. 5 hold their largest value 3 times (ties to the lower id).
  const Layout layout = vllm_layout(kReal, 4);
  FullLogits padded = make_logits(DType::bf16, kRows, kReal, layout.padded, 17, 3.0f);
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t c : {997 - 100 * r, 3 + 150 * r, 500 + r}) {
      padded.half[static_cast<std::size_t>(r * layout.padded + c)] = canon::float_to_bf16(20.0f);
    }
  }
  Rows rows = mixed_rows();
  rows.temperature.assign(kRows, 0.0f);
  const ContractOptions copt{.dtype = DType::bf16};
  const SampleResult s = run_sample(op, padded, layout, copt, options_of(rows))[0];
  int ties = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    int64_t best = 0;
    int equal = 0;
    for (int64_t c = 1; c < kReal; ++c) {
      if (padded.at(r, c) > padded.at(r, best)) {
        best = c;
        equal = 0;
      } else if (padded.at(r, c) == padded.at(r, best)) {
        ++equal;
      }
    }
    ties += equal > 0;
    EXPECT_EQ(s.tokens[r], best) << "row " << r;
  }
  EXPECT_GT(ties, 0) << "no tie was exercised";
  // Scored at temperature 1: the plain forward at temperature 1.
  const TpRun full = run_tp(op, padded, layout, s.tokens, copt, {}, {});
  EXPECT_EQ(bits(s.full_logp), bits(full.ranks[0].result.logp));
  // A greedy row ignores its seed and position.
  Rows other = rows;
  for (auto& v : other.seeds) v += 5;
  for (auto& v : other.positions) v += 9;
  EXPECT_EQ(run_sample(op, padded, layout, copt, options_of(other))[0].tokens, s.tokens);
}

// Draws of one row at positions 0 .. n-1: the counts of each id.
std::vector<int64_t> counts_of(const LogprobOp& op, const FullLogits& row, const Layout& layout,
                               int64_t n, float t, int32_t top_k) {
  // n rows, each the same logits row, one position each (a batch of n draws).
  const FullLogits many = take_rows(row, std::vector<int64_t>(static_cast<std::size_t>(n), 0));
  std::vector<int64_t> seeds(static_cast<std::size_t>(n), 12345), positions(seeds.size());
  std::iota(positions.begin(), positions.end(), 0);
  const std::vector<float> temperature(seeds.size(), t);
  const std::vector<int32_t> k(seeds.size(), top_k);
  const SampleResult s = run_sample(
      op, many, layout, {},
      {.seeds = seeds,
       .positions = positions,
       .temperature = temperature,
       .top_k = top_k > 0 ? std::span<const int32_t>(k) : std::span<const int32_t>()})[0];
  std::vector<int64_t> counts(static_cast<std::size_t>(layout.real), 0);
  for (int64_t tok : s.tokens) ++counts[static_cast<std::size_t>(tok)];
  return counts;
}

// Pearson's chi-square of counts against probabilities p (each expected count >= 5).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n) {
  double x2 = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * static_cast<double>(n);
    if (p[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "id " << i << " has probability 0";
      continue;
    }
    x2 += (static_cast<double>(counts[i]) - e) * (static_cast<double>(counts[i]) - e) / e;
  }
  return x2;
}

TEST(Sampler, FrequenciesOverPositionsMatchTheSoftmax) {
  // 20000 draws of a 16-id row at temperature 0.7 (over TP 3) and with top-k 6 at temperature
  // 1.6: Pearson's chi-square against softmax(z) (renormalised over the kept ids) stays below the
  // 1e-4 quantile (15 degrees of freedom: 42.6; 5: 25.7); the draws with the temperature
  // forgotten, or without the renormalisation, are far above it.
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  constexpr int64_t kIds = 16, kDraws = 20000;
  const Layout layout = vllm_layout(kIds, 3);  // padded to 64: 22, 22, 20 columns
  FullLogits row = make_logits(DType::fp32, 1, kIds, layout.padded, 0, 1.0f);
  for (int64_t c = 0; c < kIds; ++c) row.f32[static_cast<std::size_t>(c)] = 0.25f * c - 2.0f;
  auto softmax = [&](float t, int32_t k) {
    std::vector<double> p(kIds, 0.0);
    double sum = 0.0;
    for (int64_t c = 0; c < kIds; ++c) {
      if (k > 0 && c < kIds - k) continue;  // increasing logits: the top k are the last k
      p[c] = std::exp(static_cast<double>(row.f32[c]) / t);
      sum += p[c];
    }
    for (double& v : p) v /= sum;
    return p;
  };
  const std::vector<int64_t> plain = counts_of(op, row, layout, kDraws, 0.7f, 0);
  EXPECT_LT(chi_square(plain, softmax(0.7f, 0), kDraws), 42.6);
  EXPECT_GT(chi_square(plain, softmax(1.0f, 0), kDraws), 200.0);  // temperature forgotten
  const std::vector<int64_t> topk = counts_of(op, row, layout, kDraws, 1.6f, 6);
  EXPECT_LT(chi_square(topk, softmax(1.6f, 6), kDraws), 25.7);
  EXPECT_GT(chi_square(topk, softmax(0.7f, 6), kDraws), 200.0);
}

TEST(Sampler, TokensStayInsideTheirKeptSets) {
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const Layout layout = vllm_layout(kReal, 5);
  const FullLogits logits = make_logits(DType::fp32, kRows, kReal, layout.padded, 41, 1.0f);
  Rows rows = mixed_rows();
  for (int64_t step = 0; step < 20; ++step) {
    for (auto& p : rows.positions) p += 1;
    const SampleResult s = run_sample(op, logits, layout, {}, options_of(rows))[0];
    for (int64_t r = 0; r < kRows; ++r) {
      if (s.kept_ids[r * s.kept_width] < 0) continue;
      const auto first = s.kept_ids.begin() + r * s.kept_width;
      EXPECT_NE(std::find(first, first + s.kept_width, s.tokens[r]), first + s.kept_width)
          << "row " << r;
    }
  }
}

// Each rank's error when rank `bad` (all ranks when -1) passes `broken` options.
RankErrors errors_of(const SampleOptions& good, const SampleOptions& broken, int bad,
                     const ContractOptions& copt = {}) {
  const Layout layout = vllm_layout(kReal, 3);
  static const FullLogits logits = make_logits(DType::fp32, kRows, kReal, 1024, 3, 3.0f);
  static const VocabParallelLogprob op(simd_kernels(), "test-simd");
  return rank_errors(3, [&](Communicator& comm) {
    const int r = comm.rank();
    const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
    const LogprobContract c = make_contract(layout, r, kRows, copt);
    sample(op, logits.shard(b.start, b.end), c, comm, bad < 0 || r == bad ? broken : good);
  });
}

TEST(Sampler, BadInputsNameTheFieldTheRowAndTheValueOnEveryRank) {
  const Rows rows = mixed_rows();
  const SampleOptions good = options_of(rows);
  struct Case {
    std::string name;
    std::function<void(Rows&, SampleOptions&)> edit;
    std::string field;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"short seeds", [](Rows& p, SampleOptions& o) { o.seeds = std::span(p.seeds).first(3); },
       "seeds", "seeds has 3 entries but there are 12 rows"},
      {"no positions", [](Rows&, SampleOptions& o) { o.positions = {}; }, "positions",
       "positions has 0 entries"},
      {"negative position", [](Rows& p, SampleOptions&) { p.positions[4] = -2; }, "positions",
       "position of row 4 is -2"},
      {"negative temperature", [](Rows& p, SampleOptions&) { p.temperature[3] = -0.5f; },
       "temperature", "temperature of row 3 is -0.5"},
      {"NaN temperature", [](Rows& p, SampleOptions&) { p.temperature[1] = std::nanf(""); },
       "temperature", "temperature of row 1 is nan"},
      {"top_k too large", [](Rows& p, SampleOptions&) { p.top_k[2] = 1025; }, "top_k",
       "top_k of row 2 is 1025"},
      {"top_p zero", [](Rows& p, SampleOptions&) { p.top_p[6] = 0.0f; }, "top_p",
       "top_p of row 6 is 0"},
      {"num_logprobs", [](Rows&, SampleOptions& o) { o.num_logprobs = 1025; }, "num_logprobs",
       "num_logprobs is 1025"},
  };
  for (const Case& c : cases) {
    for (int bad : {-1, 1}) {
      Rows p = rows;
      SampleOptions broken = options_of(p);
      c.edit(p, broken);
      const RankErrors e = errors_of(good, broken, bad);
      ASSERT_TRUE(e.finished) << c.name;
      for (int r = 0; r < 3; ++r) {
        const std::string& msg = e.errors[static_cast<std::size_t>(r)];
        if (bad < 0 || r == bad) {
          EXPECT_THAT(msg, HasSubstr(c.says)) << c.name << " rank " << r;
        } else {
          EXPECT_THAT(msg, HasSubstr("rank 1 failed local validation")) << c.name;
        }
      }
    }
  }
  // The field and code, on one rank.
  Rows p = rows;
  p.positions[0] = -1;
  const Layout tp1{kReal, kReal, {{0, kReal}}};
  const FullLogits logits = make_logits(DType::fp32, kRows, kReal, kReal, 3, 3.0f);
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  SelfComm self;
  const LogprobContract c1 = make_contract(tp1, 0, kRows, {});
  try {
    sample(op, logits.shard(0, kReal), c1, self, options_of(p));
    ADD_FAILURE() << "no error";
  } catch (const ContractError& e) {
    EXPECT_EQ(e.code(), ErrorCode::out_of_range);
    EXPECT_EQ(e.field(), "positions");
  }
  // Per-row temperatures with a contract temperature other than 1.
  const LogprobContract hot = make_contract(tp1, 0, kRows, {.temperature = 2.0f});
  try {
    sample(op, logits.shard(0, kReal), hot, self, options_of(rows));
    ADD_FAILURE() << "no error";
  } catch (const ContractError& e) {
    EXPECT_EQ(e.code(), ErrorCode::conflicting_fields);
    EXPECT_EQ(e.field(), "temperature");
  }
  // Without per-row temperatures the contract's applies to every row.
  SampleOptions scalar = options_of(rows);
  scalar.temperature = {};
  EXPECT_EQ(sample(op, logits.shard(0, kReal), hot, self, scalar).tokens.size(), 12u);
}

TEST(Sampler, RanksThatDisagreeFailTogether) {
  const Rows rows = mixed_rows();
  const SampleOptions good = options_of(rows);
  const std::vector<std::pair<std::string, std::function<void(Rows&, SampleOptions&)>>> edits = {
      {"seeds", [](Rows& p, SampleOptions&) { p.seeds[5] += 1; }},
      {"positions", [](Rows& p, SampleOptions&) { p.positions[0] += 1; }},
      {"temperature", [](Rows& p, SampleOptions&) { p.temperature[2] = 0.5f; }},
      {"top_k", [](Rows& p, SampleOptions&) { p.top_k[0] = 3; }},
      {"top_p", [](Rows& p, SampleOptions&) { p.top_p[0] = 0.5f; }},
      {"num_logprobs", [](Rows&, SampleOptions& o) { o.num_logprobs = 2; }},
  };
  for (const auto& [field, edit] : edits) {
    Rows p = rows;
    SampleOptions broken = options_of(p);
    edit(p, broken);
    const RankErrors e = errors_of(good, broken, 2);
    ASSERT_TRUE(e.finished) << field;
    for (const std::string& msg : e.errors) {
      EXPECT_THAT(msg, HasSubstr("cross-rank preflight failed")) << field;
    }
  }
  // The field is named on every rank.
  const Layout layout = vllm_layout(kReal, 2);
  const FullLogits logits = make_logits(DType::fp32, kRows, kReal, layout.padded, 3, 3.0f);
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  Rows other = rows;
  other.seeds[1] = 99;
  std::vector<std::string> fields(2);
  run_ranks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
    const LogprobContract c = make_contract(layout, r, kRows, {});
    try {
      sample(op, logits.shard(b.start, b.end), c, comm,
             r == 0 ? options_of(rows) : options_of(other));
    } catch (const ContractError& e) {
      EXPECT_EQ(e.code(), ErrorCode::ranks_disagree);
      fields[static_cast<std::size_t>(r)] = e.field();
    }
  });
  EXPECT_EQ(fields, (std::vector<std::string>{"seeds", "seeds"}));
}

}  // namespace
}  // namespace detlogp::testing
