// The logit softcap through the logits operator on the in-process rank group: bitwise across
// TP degrees (even and uneven shards, a Gemma-sized vocabulary), batch composition and threads;
// logp, LSE and the gradient against a float64 oracle within the bounds of docs/numerics.md;
// the contract's validation, JSON, fingerprint and capabilities; ranks that disagree on the cap
// fail together.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "detlogp/capability.hpp"
#include "detlogp/registry.hpp"
#include "tp_compare.hpp"

namespace detlogp::testing {
namespace {

using ::testing::HasSubstr;

constexpr float kCap = 30.0f;  // Gemma's final_logit_softcapping

// Tile-aligned shards of `tiles_per_rank` tiles each, the last rank to the padded end.
Layout uneven(int64_t real, int64_t padded, const std::vector<int64_t>& tiles_per_rank, int64_t w) {
  Layout l{real, padded, {}};
  int64_t start = 0;
  for (std::size_t r = 0; r < tiles_per_rank.size(); ++r) {
    const int64_t end = r + 1 == tiles_per_rank.size() ? padded : start + tiles_per_rank[r] * w;
    l.bounds.push_back({start, end});
    start = end;
  }
  return l;
}

// A Gemma-sized vocabulary (262144) with a cap of 30 and logits large enough for the cap to
// matter: TP 1, 2, 4, 8 with Megatron padding and uneven shards, the reference kernels at TP 1
// against the SIMD kernels everywhere, bf16 and fp32, with temperature 1 and 0.7.
TEST(Softcap, BitwiseAcrossTpDegreesAtGemmaVocabulary) {
  const int64_t real = 262144, rows = 3;
  const auto targets = targets_for(rows, real, 3);
  const GradInputs grads{grads_for(rows, 4), grads_for(rows, 5), grads_for(rows, 6)};
  const VocabParallelLogprob simd(simd_kernels(), "test-simd");
  const VocabParallelLogprob ref(reference_kernels(), "test-reference");
  const ForwardOptions fopt{.entropy = true, .exec = {.threads = 2}};
  for (DType dtype : {DType::bf16, DType::fp32}) {
    for (float tau : {1.0f, 0.7f}) {
      const ContractOptions copt{.dtype = dtype, .temperature = tau, .softcap = kCap};
      const std::string what0 = std::string(to_string(dtype)) + " tau " + std::to_string(tau);
      const FullLogits base_logits = make_logits(dtype, rows, real, real, 7, 25.0f);
      const Layout one{real, real, {{0, real}}};
      const TpRun want = run_tp(ref, base_logits, one, targets, copt, fopt, grads);
      expect_same(want, run_tp(simd, base_logits, one, targets, copt, fopt, grads), real,
                  what0 + " simd TP 1");
      for (int64_t tp : {2, 4, 8}) {
        const VocabLayout ml = megatron_bounds(real, tp);
        const FullLogits logits = make_logits(dtype, rows, real, ml.padded_vocab_size, 7, 25.0f);
        const Layout even{real, ml.padded_vocab_size, ml.vocab_shard_bounds};
        std::vector<int64_t> tiles(static_cast<std::size_t>(tp));
        for (int64_t r = 0; r < tp; ++r) tiles[static_cast<std::size_t>(r)] = 3 + 37 * r;
        const Layout odd = uneven(real, ml.padded_vocab_size, tiles, 128);
        for (const Layout* layout : {&even, &odd}) {
          expect_same(
              want, run_tp(simd, logits, *layout, targets, copt, fopt, grads), real,
              what0 + " TP " + std::to_string(tp) + (layout == &even ? " even" : " uneven"));
        }
      }
    }
  }
}

// A row alone, the same row inside batches of other sizes and positions, and thread counts:
// the same bits, with a cap (small vocabulary, many special values).
TEST(Softcap, RowAloneEqualsTheRowInABatchAndThreadsDoNotMatter) {
  const int64_t real = 1000, padded = 1024, rows = 9;
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  FullLogits logits = make_logits(DType::fp32, rows, real, padded, 17, 40.0f);
  logits.f32[3 * padded + 5] = std::numeric_limits<float>::infinity();
  logits.f32[4 * padded + 6] = -std::numeric_limits<float>::infinity();
  const auto targets = targets_for(rows, real, 18);
  const ContractOptions copt{.tile_width = 64, .temperature = 1.5f, .softcap = 7.5f};
  const Layout layout{real, padded, {{0, 512}, {512, padded}}};
  const GradInputs grads{grads_for(rows, 1), grads_for(rows, 2), grads_for(rows, 3)};
  const TpRun batch =
      run_tp(op, logits, layout, targets, copt, {.entropy = true, .exec = {.threads = 1}}, grads);
  for (int threads : {2, 3}) {
    expect_same(batch,
                run_tp(op, logits, layout, targets, copt,
                       {.entropy = true, .exec = {.threads = threads}}, grads),
                real, "threads " + std::to_string(threads));
  }
  for (int64_t i : {0, 3, 4, 8}) {
    FullLogits one = logits;
    one.rows = 1;
    one.f32.assign(logits.f32.begin() + i * padded, logits.f32.begin() + (i + 1) * padded);
    const auto idx = static_cast<std::size_t>(i);
    const TpRun alone =
        run_tp(op, one, layout, {targets[idx]}, copt, {.entropy = true},
               {{grads.grad_logp[idx]}, {grads.grad_lse[idx]}, {grads.grad_entropy[idx]}});
    const LogprobResult& a = alone.ranks[0].result;
    const LogprobResult& b = batch.ranks[0].result;
    EXPECT_EQ(canon::bits_of(a.logp[0]), canon::bits_of(b.logp[idx])) << "row " << i;
    EXPECT_EQ(canon::bits_of(a.lse[0]), canon::bits_of(b.lse[idx])) << "row " << i;
    EXPECT_EQ(canon::bits_of(a.entropy[0]), canon::bits_of(b.entropy[idx])) << "row " << i;
    for (int64_t c = 0; c < real; ++c) {
      ASSERT_EQ(canon::bits_of(alone.grad.at(0, c)), canon::bits_of(batch.grad.at(i, c)))
          << "row " << i << " column " << c;
    }
  }
  // The +inf logit is capped to a finite value: its row is finite.
  EXPECT_TRUE(std::isfinite(batch.ranks[0].result.lse[3]));
  EXPECT_TRUE(std::isfinite(batch.ranks[0].result.lse[4]));
}

// logp and LSE within the documented bounds of the exact (float64) values on the exactly
// capped logits, the gradient close to the float64 gradient; and far from the uncapped values.
TEST(Softcap, AccurateAgainstFloat64) {
  const int64_t real = 5000, padded = 5120, rows = 8;
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  for (float cap : {kCap, 3.0f}) {
    for (float tau : {1.0f, 0.6f}) {
      const FullLogits logits = make_logits(DType::fp32, rows, real, padded, 31, 20.0f);
      const auto targets = targets_for(rows, real, 32);
      const ContractOptions copt{.temperature = tau, .softcap = cap};
      const Layout layout{real, padded, {{0, 2560}, {2560, padded}}};
      const TpRun run = run_tp(op, logits, layout, targets, copt, {.entropy = true},
                               {.grad_logp = std::vector<float>(rows, 1.0f)});
      const LogprobResult& r = run.ranks[0].result;
      const double cap_term = 6.0 * std::ldexp(1.0, -23) * cap / tau;
      for (int64_t i = 0; i < rows; ++i) {
        std::vector<double> z(static_cast<std::size_t>(real));
        double mx = -INFINITY;
        for (int64_t c = 0; c < real; ++c) {
          z[c] = cap * std::tanh(static_cast<double>(logits.at(i, c)) / cap) / tau;
          mx = std::max(mx, z[c]);
        }
        double s = 0.0, plain_mx = -INFINITY;
        for (int64_t c = 0; c < real; ++c) {
          s += std::exp(z[c] - mx);
          plain_mx = std::max(plain_mx, static_cast<double>(logits.at(i, c)) / tau);
        }
        const double lse = mx + std::log(s);
        const double logp = z[targets[i]] - lse;
        const auto ulp = [](double v) { return std::ldexp(1.0, std::ilogb(v) - 23); };
        const double lse_bound = ulp(lse) / 2 + 1e-5 + cap_term / 2;
        const double logp_bound = ulp(lse) / 2 + ulp(logp) / 2 + 1e-5 + cap_term;
        EXPECT_NEAR(r.lse[i], lse, lse_bound) << "cap " << cap << " tau " << tau << " row " << i;
        EXPECT_NEAR(r.logp[i], logp, logp_bound) << "cap " << cap << " tau " << tau << " row " << i;
        // Not the uncapped LSE (at least its max logit, far above the cap).
        EXPECT_LT(r.lse[i], plain_mx - 1.0);
        for (int64_t c = 0; c < real; c += 37) {
          const double th = std::tanh(static_cast<double>(logits.at(i, c)) / cap);
          const double p = std::exp(z[c] - lse);
          const double want = ((c == targets[i] ? 1.0 : 0.0) - p) * (1.0 - th * th) / tau;
          EXPECT_NEAR(run.grad.at(i, c), want, 1e-5) << "row " << i << " column " << c;
        }
      }
    }
  }
}

TEST(Softcap, ContractRejectsBadCapsNamingFieldAndValue) {
  const Layout layout{100, 128, {{0, 128}}};
  for (float bad :
       {0.0f, -0.0f, -1.0f, std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    try {
      make_contract(layout, 0, 2, {.softcap = bad});
      ADD_FAILURE() << "softcap " << bad << " was accepted";
    } catch (const ContractError& e) {
      EXPECT_EQ(e.code(), ErrorCode::out_of_range);
      EXPECT_EQ(e.field(), "softcap");
      EXPECT_THAT(e.what(), HasSubstr("softcap must be a finite number > 0"));
    }
  }
  try {
    make_contract(layout, 0, 2, {.softcap = -2.5f});
  } catch (const ContractError& e) {
    EXPECT_THAT(e.what(), HasSubstr("-2.5"));
  }
}

TEST(Softcap, JsonAndFingerprintCarryTheCapOnlyWhenSet) {
  const Layout layout{100, 128, {{0, 128}}};
  const LogprobContract none = make_contract(layout, 0, 2, {});
  const LogprobContract capped = make_contract(layout, 0, 2, {.softcap = kCap});
  const LogprobContract other = make_contract(layout, 0, 2, {.softcap = 50.0f});
  EXPECT_THAT(none.to_json(), ::testing::Not(HasSubstr("softcap")));
  EXPECT_THAT(capped.to_json(), HasSubstr("\"softcap\":30.0"));
  EXPECT_FALSE(none.softcap().has_value());
  EXPECT_EQ(*capped.softcap(), kCap);
  EXPECT_NE(none.cross_rank_fingerprint(), capped.cross_rank_fingerprint());
  EXPECT_NE(capped.cross_rank_fingerprint(), other.cross_rank_fingerprint());
}

// The CPU backends declare the cap; a backend that does not (the CUDA backend's declaration) is
// refused with the reason.
TEST(Softcap, CapabilitiesDeclareItAndRefuseWithTheReason) {
  const Layout layout{100, 128, {{0, 128}}};
  const LogprobContract capped = make_contract(layout, 0, 2, {.softcap = kCap});
  const LogprobContract none = make_contract(layout, 0, 2, {});
  const BackendCapability cpu = canon_capability("cpu", ImplementationKind::production);
  const BackendCapability without =
      canon_capability("no-cap", ImplementationKind::production, /*softcap=*/false);
  EXPECT_TRUE(cpu.supports(capped));
  EXPECT_TRUE(without.supports(none));
  EXPECT_THAT(without.incompatibilities(capped),
              ::testing::ElementsAre("softcap=30 is unsupported"));
  EXPECT_THAT(cpu.to_json(), HasSubstr("\"supports_softcap\":true"));
}

// Ranks that disagree on the cap fail together, each naming the softcap.
TEST(Softcap, RanksThatDisagreeOnTheCapFailTogether) {
  const int64_t real = 256, rows = 2;
  const Layout layout{real, real, {{0, 128}, {128, real}}};
  const FullLogits logits = make_logits(DType::fp32, rows, real, real, 3);
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const RankErrors errs = rank_errors(2, [&](Communicator& comm) {
    const int r = comm.rank();
    const LogprobContract c = make_contract(
        layout, r, rows, {.softcap = r == 0 ? std::optional<float>(kCap) : std::optional<float>()});
    const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
    const std::vector<int64_t> targets = {0, 1};
    op.forward(logits.shard(b.start, b.end), targets, c, comm, {});
  });
  ASSERT_TRUE(errs.finished);
  for (const std::string& e : errs.errors) EXPECT_THAT(e, HasSubstr("softcap"));
}

}  // namespace
}  // namespace detlogp::testing
