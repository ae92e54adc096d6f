// Shard bounds that are not multiples of the tile width through the fused lm_head on the
// in-process rank group: vLLM's layouts at a Qwen3-sized vocabulary, ranks with no columns or no
// real rows, ranks inside one tile, a tile split over five ranks, random partitions up to TP 8,
// with temperature, softcap and per-row temperatures, bf16 and fp32 (gradients in fp32 or the
// input dtype), the scalar reference and the SIMD kernels, threads and row blocks: logp, LSE,
// entropy and grad_hidden on every rank, and every grad_weight row, bitwise equal to TP 1 and to
// a tile-aligned layout; kept sets given and recomputed (top-k, top-p); each gradient alone; a
// row alone equals the row in the batch, and a float64 oracle; the fragment traffic; kernels
// without the capability, disagreeing ranks, overlaps and gaps fail on every rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "detlogp/fused.hpp"
#include "detlogp/fused_dispatch.hpp"
#include "fused_test_util.hpp"
#include "tp_compare.hpp"

namespace detlogp::testing {
namespace {

using ::testing::HasSubstr;

// Hidden states and an lm_head weight of `rows` rows; weight rows at or past `real` hold huge
// values (padding: never read).
struct Inputs {
  FullLogits hidden;
  FullLogits weight;
};

Inputs make_inputs(DType dtype, int64_t rows, int64_t hs, int64_t real, int64_t weight_rows,
                   uint32_t salt) {
  Inputs in{make_matrix(dtype, rows, hs, salt, 1.0f),
            make_matrix(dtype, weight_rows, hs, salt + 1, 0.5f)};
  for (int64_t r = real; r < weight_rows; ++r) {
    for (int64_t c = 0; c < hs; ++c) {
      const auto i = static_cast<std::size_t>(r * hs + c);
      if (dtype == DType::fp32) {
        in.weight.f32[i] = 3e4f;
      } else {
        in.weight.half[i] = canon::float_to_bf16(3e4f);
      }
    }
  }
  return in;
}

// |got - want| <= 1e-5 max(1, |want|).
bool near_oracle(float got, long double want) {
  return std::abs(static_cast<long double>(got) - want) <=
         1e-5L * std::max<long double>(1.0L, std::abs(want));
}

// Every rank of `b` has rank 0's outputs of `a` (logp, LSE, entropy, grad_hidden); the real
// grad_weight rows are equal and every padding row of `b`'s layout is +0.
void expect_same_run(const FusedRun& a, const FusedRun& b, int64_t real, int64_t padded, int64_t hs,
                     const std::string& what) {
  for (std::size_t r = 0; r < b.ranks.size(); ++r) {
    EXPECT_EQ(bits(a.ranks[0].logp), bits(b.ranks[r].logp)) << what << ": logp rank " << r;
    EXPECT_EQ(bits(a.ranks[0].lse), bits(b.ranks[r].lse)) << what << ": lse rank " << r;
    EXPECT_EQ(bits(a.ranks[0].entropy), bits(b.ranks[r].entropy)) << what << ": entropy rank " << r;
    EXPECT_EQ(a.ranks[0].kept_ids, b.ranks[r].kept_ids) << what << ": kept_ids rank " << r;
    EXPECT_EQ(bits(a.grad_hidden[0]), bits(b.grad_hidden[r])) << what << ": grad_hidden rank " << r;
  }
  const auto n = static_cast<std::ptrdiff_t>(real * hs);
  EXPECT_EQ(bits({a.grad_weight.begin(), a.grad_weight.begin() + n}),
            bits({b.grad_weight.begin(), b.grad_weight.begin() + n}))
      << what << ": grad_weight";
  for (int64_t i = real * hs; i < padded * hs; ++i) {
    ASSERT_EQ(canon::bits_of(b.grad_weight[static_cast<std::size_t>(i)]), 0u)
        << what << ": grad_weight padding row " << i / hs;
  }
}

// Qwen3's vocabulary (151936) in vLLM's layouts at TP 2, 3, 4, 8 (37984 rows per rank at TP 4:
// 296 tiles and 96 columns) against TP 1 and Megatron's tile-aligned TP 4 layout; bf16 and fp32,
// entropy and every gradient, gradients in fp32 and in bf16.
TEST(FusedUnalignedBounds, VllmLayoutsAtQwenVocabularyEqualTp1AndAligned) {
  const int64_t real = 151936, rows = 3, hs = 20;
  const VocabLayout ml = megatron_bounds(real, 4);
  const auto targets = targets_for(rows, real, 11);
  const GradInputs grads{grads_for(rows, 12), grads_for(rows, 13), grads_for(rows, 14)};
  for (DType dtype : {DType::bf16, DType::fp32}) {
    const Inputs in = make_inputs(dtype, rows, hs, real, ml.padded_vocab_size, 15);
    for (bool narrow : {false, true}) {
      if (narrow && dtype == DType::fp32) continue;
      const FusedRunOptions o{.fused = {.entropy = true, .exec = {.threads = 2}},
                              .grads = grads,
                              .grads_in_input_dtype = narrow};
      const std::string what0 =
          std::string(to_string(dtype)) + (narrow ? " grads in bf16 " : " grads in fp32 ");
      const FusedRun want =
          run_fused(in.hidden, in.weight, {real, real, {{0, real}}}, targets, {}, o);
      const Layout aligned{real, ml.padded_vocab_size, ml.vocab_shard_bounds};
      expect_same_run(want, run_fused(in.hidden, in.weight, aligned, targets, {}, o), real,
                      aligned.padded, hs, what0 + "aligned TP 4");
      for (int64_t tp : {2, 3, 4, 8}) {
        const Layout l = vllm_layout(real, tp);
        ASSERT_EQ(l.padded, real);
        if (tp == 4) {
          ASSERT_EQ(l.bounds[1].start % 128, 96);
        }
        expect_same_run(want, run_fused(in.hidden, in.weight, l, targets, {}, o), real, l.padded,
                        hs, what0 + "TP " + std::to_string(tp) + " " + show(l));
      }
    }
  }
}

// Hand-made layouts of a small vocabulary (real 1000, padded 1024) at W = 128 and W = 16: ranks
// with no columns (first, middle, last), ranks inside one tile, one tile split over five ranks,
// the last real tile split, ranks holding only padding, plus random partitions up to TP 8;
// against TP 1 on the scalar reference, with a temperature or per-row temperatures and a
// softcap, the SIMD kernels on 3 threads with row blocks of 2 and the reference on 1 thread.
TEST(FusedUnalignedBounds, AnyPartitionEqualsTp1WithSoftcapAndTemperatures) {
  const int64_t real = 1000, padded = 1024, rows = 5, hs = 37;
  const auto targets = targets_for(rows, real, 21);
  const GradInputs grads{grads_for(rows, 22), grads_for(rows, 23), grads_for(rows, 24)};
  const std::vector<float> row_tau = {0.7f, 1.0f, 1.3f, 2.0f, 0.5f};
  for (int64_t w : {128, 16}) {
    const std::vector<Layout> layouts = split_tile_layouts(w);
    for (DType dtype : {DType::bf16, DType::fp32}) {
      const Inputs in = make_inputs(dtype, rows, hs, real, padded, 25);
      for (bool per_row : {false, true}) {
        const ContractOptions copt{
            .tile_width = w, .temperature = per_row ? 1.0f : 0.8f, .softcap = 20.0f};
        FusedRunOptions ref{.kernel = "scalar-reference",
                            .fused = {.entropy = true, .exec = {.threads = 1}},
                            .grads = grads,
                            .grads_in_input_dtype = dtype != DType::fp32};
        if (per_row) ref.fused.row_temperature = row_tau;
        FusedRunOptions simd = ref;
        simd.kernel = "";
        simd.fused.exec.threads = 3;
        simd.fused.row_block = 2;
        const FusedRun want =
            run_fused(in.hidden, in.weight, {real, padded, {{0, padded}}}, targets, copt, ref);
        const std::string what0 = std::string(to_string(dtype)) + " W " + std::to_string(w) +
                                  (per_row ? " per-row tau " : " tau 0.8 ");
        for (const Layout& l : layouts) {
          expect_same_run(want, run_fused(in.hidden, in.weight, l, targets, copt, simd), real,
                          padded, hs, what0 + "simd " + show(l));
          expect_same_run(want, run_fused(in.hidden, in.weight, l, targets, copt, ref), real,
                          padded, hs, what0 + "reference " + show(l));
        }
      }
    }
  }
}

// Kept sets with bounds that split tiles: given ids, and sets recomputed by top-k and top-p
// (whose candidates lie on every rank) in a mixed batch, with inactive rows, equal TP 1 on
// every kernel.
TEST(FusedUnalignedBounds, KeptSetsGivenAndRecomputedEqualTp1) {
  const int64_t real = 900, padded = 960, rows = 6, hs = 24, w = 64, width = 150;
  const Inputs in = make_inputs(DType::bf16, rows, hs, real, padded, 31);
  const auto targets = targets_for(rows, real, 32);
  const auto ids = kept_for(targets, real, width, {1, 3, 65, 150, 130, 64}, 33);
  // Row 3 is unrestricted (top_k 0, top_p 1): a mixed batch, that row over the full vocabulary.
  const std::vector<int32_t> top_k = {1, 40, 0, 0, 64, 200};
  const std::vector<float> top_p = {1.0f, 0.9f, 0.5f, 1.0f, 0.99f, 0.3f};
  const GradInputs grads{grads_for(rows, 34), grads_for(rows, 35), grads_for(rows, 36)};
  const ContractOptions copt{
      .active = {true, true, false, true, true, true}, .tile_width = w, .softcap = 6.0f};
  const std::vector<Layout> layouts = {
      vllm_layout(real, 4), from_cuts(real, padded, {100, 101, 450, 700}),
      from_cuts(real, padded, {65, 70, 70, 127, 899}), random_layout(real, padded, 5, 37)};
  for (bool recompute : {false, true}) {
    FusedRunOptions o{.fused = {.entropy = true, .row_block = 4}, .grads = grads};
    if (recompute) {
      o.fused.kept = {.outside = OutsideKept::neg_inf, .top_k = top_k, .top_p = top_p};
    } else {
      o.fused.kept = {.ids = ids, .width = width};
    }
    FusedRunOptions ref = o;
    ref.kernel = "scalar-reference";
    const FusedRun want =
        run_fused(in.hidden, in.weight, {real, padded, {{0, padded}}}, targets, copt, ref);
    ASSERT_GT(want.ranks[0].kept_width, 0);
    for (const Layout& l : layouts) {
      for (const FusedRunOptions* run : {&o, &ref}) {
        expect_same_run(want, run_fused(in.hidden, in.weight, l, targets, copt, *run), real, padded,
                        hs,
                        std::string(recompute ? "top-k/top-p " : "kept ids ") +
                            (run->kernel.empty() ? "simd " : "reference ") + show(l));
      }
    }
  }
}

// grad_weight alone and grad_hidden alone (the other skipped on every rank) are the bits they
// have when both are computed.
TEST(FusedUnalignedBounds, EachGradientAloneEqualsBoth) {
  const int64_t real = 500, padded = 512, rows = 4, hs = 19, w = 32;
  const Inputs in = make_inputs(DType::fp32, rows, hs, real, padded, 41);
  const auto targets = targets_for(rows, real, 42);
  const std::vector<float> g = grads_for(rows, 43);
  const Layout l = from_cuts(real, padded, {33, 40, 40, 250, 499});
  const ContractOptions copt{.tile_width = w};
  const FusedRun both = run_fused(in.hidden, in.weight, l, targets, copt, {.grads = {g, {}, {}}});
  const FusedLinearLogprob op;
  for (bool want_hidden : {false, true}) {
    std::vector<float> gw(static_cast<std::size_t>(padded * hs), -1.0f);
    std::vector<std::vector<float>> gh(l.bounds.size());
    run_ranks(static_cast<int>(l.bounds.size()), [&](Communicator& comm) {
      const int r = comm.rank();
      const VocabRange b = l.bounds[static_cast<std::size_t>(r)];
      const LogprobContract c = make_contract(l, r, rows, copt);
      const auto res =
          op.forward(whole(in.hidden), row_range(in.weight, b.start, b.end), targets, c, comm);
      auto& h = gh[static_cast<std::size_t>(r)];
      h.assign(static_cast<std::size_t>(rows * hs), -1.0f);
      op.backward(res, {.grad_logp = g},
                  MutableLogitsView{.data = want_hidden ? h.data() : nullptr,
                                    .dtype = DType::fp32,
                                    .rows = rows,
                                    .cols = hs,
                                    .row_stride = hs},
                  MutableLogitsView{.data = want_hidden ? nullptr : gw.data() + b.start * hs,
                                    .dtype = DType::fp32,
                                    .rows = b.size(),
                                    .cols = hs,
                                    .row_stride = hs},
                  comm);
    });
    if (want_hidden) {
      for (const auto& h : gh) EXPECT_EQ(bits(h), bits(both.grad_hidden[0]));
    } else {
      EXPECT_EQ(bits(gw), bits(both.grad_weight));
    }
  }
}

// Each row alone gives the bits it has inside the batch; logp, LSE and entropy are within 1e-5
// of a float64 oracle of hidden x weight, and the gradients within 1e-5 of the oracle's.
TEST(FusedUnalignedBounds, RowAloneEqualsTheRowInTheBatchAndMatchesTheOracle) {
  const int64_t real = 700, padded = 704, rows = 4, hs = 24, w = 64;
  const Layout l = from_cuts(real, padded, {65, 70, 70, 200, 699});
  const Inputs in = make_inputs(DType::fp32, rows, hs, real, padded, 51);
  const auto targets = targets_for(rows, real, 52);
  const std::vector<float> g_logp = grads_for(rows, 53), g_lse = grads_for(rows, 54);
  const ContractOptions copt{.tile_width = w};
  const FusedRunOptions o{.fused = {.entropy = true}, .grads = {g_logp, g_lse, {}}};
  const FusedRun batch = run_fused(in.hidden, in.weight, l, targets, copt, o);
  std::vector<long double> gw(static_cast<std::size_t>(real * hs), 0.0L);
  for (int64_t i = 0; i < rows; ++i) {
    const auto k = static_cast<std::size_t>(i);
    FusedRunOptions one = o;
    one.grads = {{g_logp[k]}, {g_lse[k]}, {}};
    const FusedRun alone =
        run_fused(take_rows(in.hidden, {i}), in.weight, l, {targets[k]}, copt, one);
    for (std::size_t r = 0; r < alone.ranks.size(); ++r) {
      EXPECT_EQ(bits({batch.ranks[0].logp[k]}), bits(alone.ranks[r].logp)) << "row " << i;
      EXPECT_EQ(bits({batch.ranks[0].lse[k]}), bits(alone.ranks[r].lse)) << "row " << i;
      EXPECT_EQ(bits({batch.ranks[0].entropy[k]}), bits(alone.ranks[r].entropy)) << "row " << i;
      EXPECT_EQ(bits({batch.grad_hidden[0].begin() + i * hs,
                      batch.grad_hidden[0].begin() + (i + 1) * hs}),
                bits(alone.grad_hidden[r]))
          << "row " << i;
    }
    // The oracle: z in float64, the softmax, d logp / dz = onehot - p, d lse / dz = p.
    std::vector<long double> z(static_cast<std::size_t>(real));
    long double mx = -INFINITY, sum = 0, h = 0;
    for (int64_t c = 0; c < real; ++c) {
      long double acc = 0;
      for (int64_t x = 0; x < hs; ++x) {
        acc += static_cast<long double>(in.hidden.at(i, x)) * in.weight.at(c, x);
      }
      z[static_cast<std::size_t>(c)] = acc;
      mx = std::max(mx, acc);
    }
    for (long double v : z) sum += std::exp(v - mx);
    const long double lse = mx + std::log(sum);
    std::vector<long double> gh(static_cast<std::size_t>(hs), 0.0L);
    for (int64_t c = 0; c < real; ++c) {
      const long double p = std::exp(z[static_cast<std::size_t>(c)] - lse);
      h -= p * (z[static_cast<std::size_t>(c)] - lse);
      const long double gz = g_logp[k] * ((c == targets[k] ? 1.0L : 0.0L) - p) + g_lse[k] * p;
      for (int64_t x = 0; x < hs; ++x) {
        gh[static_cast<std::size_t>(x)] += gz * in.weight.at(c, x);
        gw[static_cast<std::size_t>(c * hs + x)] += gz * in.hidden.at(i, x);
      }
    }
    EXPECT_TRUE(near_oracle(batch.ranks[0].lse[k], lse)) << "row " << i;
    EXPECT_TRUE(near_oracle(batch.ranks[0].logp[k], z[static_cast<std::size_t>(targets[k])] - lse));
    EXPECT_TRUE(near_oracle(batch.ranks[0].entropy[k], h)) << "row " << i;
    for (int64_t x = 0; x < hs; ++x) {
      EXPECT_TRUE(near_oracle(batch.grad_hidden[0][static_cast<std::size_t>(i * hs + x)],
                              gh[static_cast<std::size_t>(x)]))
          << "grad_hidden row " << i << " column " << x;
    }
  }
  for (int64_t c = 0; c < real * hs; ++c) {
    ASSERT_TRUE(near_oracle(batch.grad_weight[static_cast<std::size_t>(c)],
                            gw[static_cast<std::size_t>(c)]))
        << "grad_weight row " << c / hs;
  }
}

// A rank without columns may pass views without data (an empty tensor's), forward and backward;
// its grad_weight is then skipped, and grad_hidden still equals TP 1 on every rank.
TEST(FusedUnalignedBounds, ARankWithoutColumnsNeedsNoData) {
  const int64_t real = 200, rows = 3, hs = 16;
  const Layout l = from_cuts(real, real, {0, 70});
  const Inputs in = make_inputs(DType::fp32, rows, hs, real, real, 61);
  const auto targets = targets_for(rows, real, 62);
  const std::vector<float> g(static_cast<std::size_t>(rows), 1.0f);
  const FusedRun want =
      run_fused(in.hidden, in.weight, {real, real, {{0, real}}}, targets, {}, {.grads = {g}});
  const FusedLinearLogprob op;
  const RankErrors errs = rank_errors(3, [&](Communicator& comm) {
    const int r = comm.rank();
    const VocabRange b = l.bounds[static_cast<std::size_t>(r)];
    const LogprobContract c = make_contract(l, r, rows, {});
    const LogitsView wv =
        r == 0 ? LogitsView{.dtype = DType::fp32, .rows = 0, .cols = hs, .row_stride = hs}
               : row_range(in.weight, b.start, b.end);
    const FusedLogprobResult res = op.forward(whole(in.hidden), wv, targets, c, comm);
    EXPECT_EQ(bits(res.logp), bits(want.ranks[0].logp)) << "rank " << r;
    std::vector<float> gh(static_cast<std::size_t>(rows * hs));
    std::vector<float> gw(static_cast<std::size_t>(b.size() * hs));
    op.backward(
        res, {.grad_logp = g},
        {.data = gh.data(), .dtype = DType::fp32, .rows = rows, .cols = hs, .row_stride = hs},
        {.data = r == 0 ? nullptr : gw.data(),
         .dtype = DType::fp32,
         .rows = b.size(),
         .cols = hs,
         .row_stride = hs},
        comm);
    EXPECT_EQ(bits(gh), bits(want.grad_hidden[0])) << "rank " << r;
    EXPECT_EQ(bits(gw), bits({want.grad_weight.begin() + b.start * hs,
                              want.grad_weight.begin() + b.end * hs}))
        << "rank " << r;
  });
  ASSERT_TRUE(errs.finished);
  for (const std::string& e : errs.errors) EXPECT_EQ(e, "");
}

// The fragment all-gathers: forward moves tokens x (widest head fragment) fp32 logits, backward
// (with grad_hidden) that many weight rows, H x dtype bytes each, whatever the number of tokens:
// at Qwen3's TP 4 vLLM layout, H 4096, bf16, 512 tokens, 96 columns (0.25% of a rank's 37984);
// nothing when aligned or at TP 1.
TEST(FusedUnalignedBounds, FragmentTrafficIsTheHeadFragments) {
  const int64_t real = 151936, rows = 512, hs = 4096;
  const LogprobContract c = make_contract(vllm_layout(real, 4), 0, rows, {.dtype = DType::bf16});
  const FusedTraffic t = FusedLinearLogprob::traffic(c, hs, true);
  EXPECT_EQ(t.forward_fragment_bytes_per_rank, rows * 96 * 4);
  EXPECT_EQ(t.backward_fragment_bytes_per_rank, 96 * hs * 2);
  const VocabLayout ml = megatron_bounds(real, 4);
  const LogprobContract aligned = make_contract({real, ml.padded_vocab_size, ml.vocab_shard_bounds},
                                                0, rows, {.dtype = DType::bf16});
  const LogprobContract one = make_contract({real, real, {{0, real}}}, 0, rows, {});
  for (const LogprobContract* x : {&aligned, &one}) {
    EXPECT_EQ(FusedLinearLogprob::traffic(*x, hs, true).forward_fragment_bytes_per_rank, 0);
    EXPECT_EQ(FusedLinearLogprob::traffic(*x, hs, true).backward_fragment_bytes_per_rank, 0);
  }
}

// The fused kernels of another backend that do not declare unaligned bounds: every rank refuses
// an unaligned layout with tile_misaligned and the fix; aligned layouts still run.
class NoSplitKernels final : public FusedKernels {
 public:
  explicit NoSplitKernels(const FusedKernels& k) : k_(k) {}
  std::string name() const override { return "no-split"; }
  const ShardKernels& shard_kernels() const override { return k_.shard_kernels(); }
  void node_partials(const FusedShard& s, std::span<const TreeNode> n, bool e,
                     std::span<NodePartial> o, const ExecOptions& x) const override {
    k_.node_partials(s, n, e, o, x);
  }
  void read_target_logits(const FusedShard& s, std::span<const int64_t> t,
                          std::span<float> o) const override {
    k_.read_target_logits(s, t, o);
  }
  void backward(const FusedShard& s, std::span<const TreeNode> n, const BackwardInputs& in,
                const MutableLogitsView& gw, std::span<float> hs,
                const ExecOptions& x) const override {
    k_.backward(s, n, in, gw, hs, x);
  }
  void kept_backward(const FusedShard& s, std::span<const int64_t> k, int64_t w,
                     std::span<const TreeNode> n, const BackwardInputs& in,
                     const MutableLogitsView& gw, std::span<float> hs) const override {
    k_.kept_backward(s, k, w, n, in, gw, hs);
  }
  void merge_hidden_sums(std::span<const TreeNode> n, std::span<float* const> s,
                         const MutableLogitsView& g) const override {
    k_.merge_hidden_sums(n, s, g);
  }
  void linear_logits(const LogitsView& h, const LogitsView& w, const MutableLogitsView& o,
                     const ExecOptions& x) const override {
    k_.linear_logits(h, w, o, x);
  }

 private:
  const FusedKernels& k_;
};

TEST(FusedUnalignedBounds, KernelsWithoutTheCapabilityRefuseOnEveryRank) {
  const int64_t real = 300, rows = 2, hs = 8;
  const Inputs in = make_inputs(DType::fp32, rows, hs, real, real, 71);
  const NoSplitKernels kernels(fused_kernels_for(""));
  const FusedLinearLogprob op(kernels, "no-split-backend");
  const std::vector<int64_t> targets = {0, 1};
  for (const Layout& l : {from_cuts(real, real, {100}), from_cuts(real, real, {128})}) {
    const bool aligned = l.bounds[0].end == 128;
    const RankErrors errs = rank_errors(2, [&](Communicator& comm) {
      const int r = comm.rank();
      const VocabRange b = l.bounds[static_cast<std::size_t>(r)];
      const LogprobContract c = make_contract(l, r, rows, {});
      try {
        op.forward(whole(in.hidden), row_range(in.weight, b.start, b.end), targets, c, comm);
      } catch (const ContractError& e) {
        // Its own error, or the first failing rank's through the preflight.
        EXPECT_TRUE(e.code() == ErrorCode::tile_misaligned || e.code() == ErrorCode::ranks_disagree)
            << e.what();
        throw;
      }
    });
    ASSERT_TRUE(errs.finished);
    for (const std::string& e : errs.errors) {
      if (aligned) {
        EXPECT_EQ(e, "");
      } else {
        EXPECT_THAT(e, HasSubstr("vocab_shard_bounds[0]=[0, 100) is not aligned"));
        EXPECT_THAT(e, HasSubstr("The fused kernels no-split do not; fix: align every bound"));
      }
    }
  }
}

// Ranks that disagree on unaligned bounds fail together, each naming the disagreement; a rank
// whose weight shard does not match its bounds fails every rank.
TEST(FusedUnalignedBounds, DisagreeingRanksAndBadShardsFailEveryRank) {
  const int64_t real = 300, rows = 2, hs = 8;
  const Inputs in = make_inputs(DType::fp32, rows, hs, real, real, 81);
  const FusedLinearLogprob op;
  const std::vector<int64_t> targets = {0, 1};
  const Layout mine = from_cuts(real, real, {100, 200});
  const Layout other = from_cuts(real, real, {100, 201});
  for (bool short_shard : {false, true}) {
    const RankErrors errs = rank_errors(3, [&](Communicator& comm) {
      const int r = comm.rank();
      const Layout& l = r == 2 && !short_shard ? other : mine;
      const LogprobContract c = make_contract(l, r, rows, {});
      const VocabRange b = l.bounds[static_cast<std::size_t>(r)];
      const int64_t end = short_shard && r == 1 ? b.end - 1 : b.end;
      op.forward(whole(in.hidden), row_range(in.weight, b.start, end), targets, c, comm);
    });
    ASSERT_TRUE(errs.finished);
    for (const std::string& e : errs.errors) {
      EXPECT_THAT(e, HasSubstr(short_shard ? "weight_shard has 99 rows" : "disagree"));
    }
  }
}

// Overlapping and gapped bounds are contract errors on every rank that builds them.
TEST(FusedUnalignedBounds, OverlapsAndGapsFailOnEveryRank) {
  for (const std::vector<VocabRange>& bounds : {std::vector<VocabRange>{{0, 101}, {100, 300}},
                                                std::vector<VocabRange>{{0, 99}, {100, 300}}}) {
    const RankErrors errs = rank_errors(2, [&](Communicator& comm) {
      try {
        ShardingSpec({.tp_rank = comm.rank(),
                      .tp_world_size = 2,
                      .vocab_shard_bounds = bounds,
                      .real_vocab_size = 300,
                      .padded_vocab_size = 300});
      } catch (const ContractError& e) {
        EXPECT_EQ(e.code(), ErrorCode::bad_shard_bounds) << e.what();
        throw;
      }
    });
    ASSERT_TRUE(errs.finished);
    for (const std::string& e : errs.errors) EXPECT_NE(e, "");
  }
}

// Dispatch serves the fused lm_head for vLLM's layout (its capability declares it).
TEST(FusedUnalignedBounds, DispatchServesUnalignedContracts) {
  const LogprobContract c = make_contract(vllm_layout(151936, 4), 1, 2, {.dtype = DType::bf16});
  const FusedDispatchResult d = get_fused_linear_logprob_op(c);
  ASSERT_NE(d.op, nullptr);
  EXPECT_TRUE(d.capability.supports_unaligned_bounds());
}

}  // namespace
}  // namespace detlogp::testing
