// Shard bounds that are not multiples of the tile width through the logits operator on the
// in-process rank group: vLLM's layouts (vocabulary padded to 64, split evenly) at a Qwen3-sized
// vocabulary, ranks with no columns, ranks inside one tile, a tile split over many ranks, with
// softcap and per-row temperatures, reference and SIMD kernels and thread counts, all bitwise
// equal to TP=1 and to a tile-aligned layout (logp, LSE, entropy, real-column gradients); the
// fragment traffic; bad bounds and disagreeing ranks fail on every rank; the capabilities that
// declare it (the fused lm_head's own tests: fused_unaligned_bounds_test.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "detlogp/capability.hpp"
#include "detlogp/fused_dispatch.hpp"
#include "detlogp/registry.hpp"
#include "tp_compare.hpp"

namespace detlogp::testing {
namespace {

using ::testing::HasSubstr;

// Qwen3's vocabulary (151936) in vLLM's layouts at TP 2, 3, 4, 8 (37984 columns per rank at
// TP 4: not a multiple of 128) against TP 1, bf16 and fp32, with entropy and every gradient.
TEST(UnalignedBounds, VllmLayoutsAtQwenVocabularyEqualTp1) {
  const int64_t real = 151936, rows = 2;
  const auto targets = targets_for(rows, real, 11);
  const GradInputs grads{grads_for(rows, 12), grads_for(rows, 13), grads_for(rows, 14)};
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const ForwardOptions fopt{.entropy = true, .exec = {.threads = 2}};
  for (DType dtype : {DType::bf16, DType::fp32}) {
    const ContractOptions copt{.dtype = dtype};
    const FullLogits logits = make_logits(dtype, rows, real, real, 15);
    const TpRun want = run_tp(op, logits, {real, real, {{0, real}}}, targets, copt, fopt, grads);
    for (int64_t tp : {2, 3, 4, 8}) {
      const Layout l = vllm_layout(real, tp);
      ASSERT_EQ(l.padded, real);
      if (tp == 4) {
        ASSERT_EQ(l.bounds[0].size(), 37984);
      }
      expect_same(want, run_tp(op, logits, l, targets, copt, fopt, grads), real,
                  std::string(to_string(dtype)) + " TP " + std::to_string(tp) + " " + show(l));
    }
  }
}

// Hand-made layouts of a small vocabulary (real 1000, padded 1024) at W = 128 and W = 16: ranks
// with no columns (first, middle, last), ranks inside one tile, one tile split over four ranks,
// ranks holding only padding (some inside the last real tile), plus random partitions up to
// TP 8; against TP 1 and a tile-aligned layout, with softcap and per-row temperatures, the
// reference kernels at TP 1 against the SIMD kernels everywhere.
TEST(UnalignedBounds, AnyPartitionEqualsTp1WithSoftcapAndRowTemperatures) {
  const int64_t real = 1000, padded = 1024, rows = 5;
  const auto targets = targets_for(rows, real, 21);
  const GradInputs grads{grads_for(rows, 22), grads_for(rows, 23), grads_for(rows, 24)};
  const std::vector<float> row_tau = {0.7f, 1.0f, 1.3f, 2.0f, 0.5f};
  const VocabParallelLogprob simd(simd_kernels(), "test-simd");
  const VocabParallelLogprob ref(reference_kernels(), "test-reference");
  for (int64_t w : {128, 16}) {
    const std::vector<Layout> layouts = split_tile_layouts(w);
    for (DType dtype : {DType::bf16, DType::fp32}) {
      for (bool per_row : {false, true}) {
        const ContractOptions copt{.dtype = dtype, .tile_width = w, .softcap = 20.0f};
        ForwardOptions fopt{.entropy = true, .exec = {.threads = 1}};
        if (per_row) fopt.row_temperature = row_tau;
        const FullLogits logits = make_logits(dtype, rows, real, padded, 25, 10.0f);
        const Layout one{real, padded, {{0, padded}}};
        const TpRun want = run_tp(ref, logits, one, targets, copt, fopt, grads);
        const std::string what0 = std::string(to_string(dtype)) + " W " + std::to_string(w) +
                                  (per_row ? " per-row tau " : " ");
        for (const Layout& l : layouts) {
          ForwardOptions threaded = fopt;
          threaded.exec.threads = 3;
          expect_same(want, run_tp(simd, logits, l, targets, copt, threaded, grads), real,
                      what0 + "simd " + show(l));
          expect_same(want, run_tp(ref, logits, l, targets, copt, fopt, grads), real,
                      what0 + "reference " + show(l));
        }
      }
    }
  }
}

// Each row alone gives the bits it has inside the batch (layout with a tile split over three
// ranks and an empty rank), and logp, LSE and entropy are within 1e-5 of a float64 oracle.
TEST(UnalignedBounds, RowAloneEqualsTheRowInTheBatchAndMatchesTheOracle) {
  const int64_t real = 700, padded = 704, rows = 4;
  const Layout l = from_cuts(real, padded, {65, 70, 70, 200, 699});
  const auto targets = targets_for(rows, real, 41);
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const ContractOptions copt{.tile_width = 64};
  const ForwardOptions fopt{.entropy = true, .exec = {.threads = 2}};
  const FullLogits logits = make_logits(DType::fp32, rows, real, padded, 42);
  const TpRun batch = run_tp(op, logits, l, targets, copt, fopt, {});
  for (int64_t i = 0; i < rows; ++i) {
    FullLogits one = logits;
    one.rows = 1;
    one.f32.assign(logits.f32.begin() + i * padded, logits.f32.begin() + (i + 1) * padded);
    const TpRun alone = run_tp(op, one, l, {targets[static_cast<std::size_t>(i)]}, copt, fopt, {});
    const LogprobResult& b = batch.ranks[0].result;
    for (const RankOutputs& r : alone.ranks) {
      EXPECT_EQ(bits({b.logp[i]}), bits(r.result.logp)) << "row " << i;
      EXPECT_EQ(bits({b.lse[i]}), bits(r.result.lse)) << "row " << i;
      EXPECT_EQ(bits({b.entropy[i]}), bits(r.result.entropy)) << "row " << i;
    }
    long double mx = -INFINITY, sum = 0, h = 0;
    for (int64_t c = 0; c < real; ++c) mx = std::max<long double>(mx, logits.at(i, c));
    for (int64_t c = 0; c < real; ++c) sum += std::exp(logits.at(i, c) - mx);
    const long double lse = mx + std::log(sum);
    for (int64_t c = 0; c < real; ++c) {
      const long double p = std::exp(logits.at(i, c) - lse);
      h -= p * (logits.at(i, c) - lse);
    }
    EXPECT_NEAR(b.lse[i], static_cast<double>(lse), 1e-5);
    EXPECT_NEAR(b.logp[i], static_cast<double>(logits.at(i, targets[i]) - lse), 1e-5);
    EXPECT_NEAR(b.entropy[i], static_cast<double>(h), 1e-5);
  }
}

// Inactive rows and targets on every rank next to a split: the logp of each row comes from the
// rank holding its target column, including columns of split tiles held by non-owners.
TEST(UnalignedBounds, TargetsInSplitTilesAndInactiveRows) {
  const int64_t real = 300, padded = 320, rows = 6;
  const Layout l = from_cuts(real, padded, {100, 101, 130, 299});
  const std::vector<int64_t> targets = {100, 128, 129, 0, 299, 127};
  const ContractOptions copt{.active = {true, true, true, false, true, true}};
  const GradInputs grads{grads_for(rows, 31), {}, {}};
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const FullLogits logits = make_logits(DType::fp32, rows, real, padded, 32);
  const TpRun want = run_tp(op, logits, {real, padded, {{0, padded}}}, targets, copt, {}, grads);
  expect_same(want, run_tp(op, logits, l, targets, copt, {}, grads), real, show(l));
  EXPECT_EQ(want.ranks[0].result.logp[3], 0.0f);
}

// A rank without columns may pass views without data (an empty tensor's), forward and backward.
TEST(UnalignedBounds, ARankWithoutColumnsNeedsNoData) {
  const int64_t real = 200, rows = 3;
  const Layout l = from_cuts(real, real, {0, 70});
  const auto targets = targets_for(rows, real, 51);
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const FullLogits logits = make_logits(DType::fp32, rows, real, real, 52);
  const TpRun want = run_tp(op, logits, {real, real, {{0, real}}}, targets, {}, {}, {});
  const RankErrors errs = rank_errors(3, [&](Communicator& comm) {
    const int r = comm.rank();
    const VocabRange b = l.bounds[static_cast<std::size_t>(r)];
    const LogprobContract c = make_contract(l, r, rows, {});
    const LogitsView v =
        r == 0 ? LogitsView{.dtype = DType::fp32, .rows = rows} : logits.shard(b.start, b.end);
    const LogprobResult res = op.forward(v, targets, c, comm, {});
    EXPECT_EQ(bits(res.logp), bits(want.ranks[0].result.logp)) << "rank " << r;
    std::vector<float> grad(static_cast<std::size_t>(rows * b.size()));
    const std::vector<float> g(static_cast<std::size_t>(rows), 1.0f);
    op.backward(res, {.grad_logp = g},
                {.data = r == 0 ? nullptr : grad.data(),
                 .dtype = DType::fp32,
                 .rows = rows,
                 .cols = b.size(),
                 .row_stride = b.size()});
  });
  ASSERT_TRUE(errs.finished);
  for (const std::string& e : errs.errors) EXPECT_EQ(e, "");
}

// The fragment all-gather moves rows x (widest head fragment) x dtype bytes: at Qwen3's TP 4
// vLLM layout in bf16, 96 columns per row (0.25% of a rank's 37984), none when aligned.
TEST(UnalignedBounds, FragmentTrafficIsOnlyTheHeadFragments) {
  const int64_t real = 151936, rows = 8;
  const Layout l = vllm_layout(real, 4);
  const LogprobContract c = make_contract(l, 0, rows, {.dtype = DType::bf16});
  EXPECT_EQ(VocabParallelLogprob::traffic(c, true).fragment_bytes_per_rank, rows * 96 * 2);
  EXPECT_EQ(VocabParallelLogprob::traffic(c, false).fragment_bytes_per_rank, 0);
  const VocabLayout ml = megatron_bounds(real, 4);
  const LogprobContract aligned =
      make_contract({real, ml.padded_vocab_size, ml.vocab_shard_bounds}, 0, rows, {});
  EXPECT_EQ(VocabParallelLogprob::traffic(aligned, true).fragment_bytes_per_rank, 0);
}

// Ranks that disagree on unaligned bounds fail together, each naming the disagreement.
TEST(UnalignedBounds, RanksThatDisagreeOnTheBoundsFailTogether) {
  const int64_t real = 300, rows = 2;
  const Layout mine = from_cuts(real, real, {100, 200});
  const Layout other = from_cuts(real, real, {100, 201});
  const FullLogits logits = make_logits(DType::fp32, rows, real, real, 3);
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const RankErrors errs = rank_errors(3, [&](Communicator& comm) {
    const int r = comm.rank();
    const Layout& l = r == 2 ? other : mine;
    const LogprobContract c = make_contract(l, r, rows, {});
    const VocabRange b = l.bounds[static_cast<std::size_t>(r)];
    const std::vector<int64_t> targets = {0, 1};
    op.forward(logits.shard(b.start, b.end), targets, c, comm, {});
  });
  ASSERT_TRUE(errs.finished);
  for (const std::string& e : errs.errors) EXPECT_THAT(e, HasSubstr("disagree"));
}

// Overlapping and gapped unaligned bounds are still contract errors.
TEST(UnalignedBounds, OverlapsAndGapsAreStillRejected) {
  for (const std::vector<VocabRange>& bounds : {std::vector<VocabRange>{{0, 101}, {100, 300}},
                                                std::vector<VocabRange>{{0, 99}, {100, 300}}}) {
    try {
      ShardingSpec({.tp_rank = 0,
                    .tp_world_size = 2,
                    .vocab_shard_bounds = bounds,
                    .real_vocab_size = 300,
                    .padded_vocab_size = 300});
      ADD_FAILURE() << "accepted bounds with an overlap or a gap";
    } catch (const ContractError& e) {
      EXPECT_EQ(e.code(), ErrorCode::bad_shard_bounds) << e.what();
    }
  }
}

// The logits op's CPU backends and the fused lm_head declare unaligned bounds; the CUDA backend's
// declaration does not, and refuses an unaligned contract with the reason (aligned ones pass).
TEST(UnalignedBounds, CapabilitiesDeclareItAndRefuseWithTheReason) {
  const LogprobContract unaligned = make_contract(vllm_layout(151936, 4), 0, 2, {});
  const VocabLayout ml = megatron_bounds(151936, 4);
  const LogprobContract aligned =
      make_contract({151936, ml.padded_vocab_size, ml.vocab_shard_bounds}, 0, 2, {});
  const BackendCapability cpu = canon_capability("cpu", ImplementationKind::production);
  const BackendCapability cuda_like =
      canon_capability("no-split", ImplementationKind::production, /*softcap=*/false,
                       /*kept_sets=*/false, /*unaligned_bounds=*/false);
  const BackendCapability fused =
      fused_linear_logprob_capability(ImplementationKind::production, "fused");
  for (const BackendCapability* cap : {&cpu, &fused}) {
    EXPECT_TRUE(cap->supports(unaligned));
    EXPECT_THAT(cap->to_json(), HasSubstr("\"supports_unaligned_bounds\":true"));
  }
  EXPECT_TRUE(cuda_like.supports(aligned));
  EXPECT_THAT(cuda_like.incompatibilities(unaligned),
              ::testing::ElementsAre("shard bounds not aligned to tile_width=128 are "
                                     "unsupported"));
}

}  // namespace
}  // namespace detlogp::testing
