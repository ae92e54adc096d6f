// The vocab-parallel operator across real processes (mpirun -np 2 / 4): every rank's outputs
// and gradient shard are bitwise equal to TP=1 computed locally on the full logits, for every
// dtype, even and uneven bounds, Megatron padding per TP, bounds that are not tile multiples;
// TP x CP splits; preflight failures reach every rank.
#include <gtest/gtest.h>

#include "detlogp/mpi_comm.hpp"
#include "detlogp/registry.hpp"
#include "mpi_inputs.hpp"
#include "op/op_test_util.hpp"

namespace detlogp::testing {
namespace {

constexpr int64_t kReal = 151936;

struct Local {
  LogprobResult result;
  FullLogits grad;
};

// TP=1 on the full logits, in this process.
Local tp1(const LogprobOp& op, const FullLogits& logits, const std::vector<int64_t>& targets,
          const ContractOptions& copt, const GradInputs& g) {
  const int64_t padded = logits.cols;
  TpRun run = run_tp(op, logits, {kReal, padded, {{0, padded}}}, targets, copt,
                     {.entropy = true, .exec = {.threads = 1}}, g);
  return {std::move(run.ranks[0].result), std::move(run.grad)};
}

std::vector<int64_t> targets_for(int64_t rows) { return spread_targets(rows, kReal, 7919, 13); }

// Runs forward + backward for this rank of `comm` (a TP group) and compares with `ref`.
void check_rank(const LogprobOp& op, Communicator& comm, const FullLogits& logits,
                const std::vector<VocabRange>& bounds, const std::vector<int64_t>& targets,
                const ContractOptions& copt, const GradInputs& g, const Local& ref,
                const std::string& what) {
  const int r = comm.rank();
  const VocabRange b = bounds[static_cast<std::size_t>(r)];
  const Layout layout{kReal, logits.cols, bounds};
  const LogprobContract c = make_contract(layout, r, logits.rows, copt);
  LogprobResult res = op.forward(logits.shard(b.start, b.end), targets, c, comm,
                                 {.entropy = true, .exec = {.threads = 1}});
  EXPECT_EQ(bits(res.logp), bits(ref.result.logp)) << what;
  EXPECT_EQ(bits(res.lse), bits(ref.result.lse)) << what;
  EXPECT_EQ(bits(res.entropy), bits(ref.result.entropy)) << what;
  // This rank's gradient shard equals TP=1's gradient on the same (real) columns.
  const std::size_t esz = dtype_size(logits.dtype);
  std::vector<uint8_t> mine(static_cast<std::size_t>(logits.rows * b.size()) * esz);
  op.backward(res,
              {.grad_logp = g.grad_logp, .grad_lse = g.grad_lse, .grad_entropy = g.grad_entropy},
              MutableLogitsView{.data = mine.data(),
                                .dtype = logits.dtype,
                                .rows = logits.rows,
                                .cols = b.size(),
                                .row_stride = b.size()});
  const auto* full = static_cast<const uint8_t*>(ref.grad.data());
  const int64_t real_end = std::min(b.end, kReal);
  for (int64_t i = 0; i < logits.rows; ++i) {
    const int64_t n = std::max<int64_t>(0, real_end - b.start);
    EXPECT_EQ(0, std::memcmp(mine.data() + i * b.size() * esz,
                             full + (i * ref.grad.cols + b.start) * esz, n * esz))
        << what << " grad row " << i;
    for (int64_t c2 = n; c2 < b.size(); ++c2) {  // padding columns exactly +0
      for (std::size_t k = 0; k < esz; ++k) {
        ASSERT_EQ(mine[(i * b.size() + c2) * esz + k], 0) << what;
      }
    }
  }
}

TEST(MpiOperator, OneTpGroupBitwiseEqualsTp1) {
  MpiComm world = MpiComm::world();
  const int tp = world.size();
  const int64_t rows = 5;
  VocabParallelLogprob op(simd_kernels(), std::string(kCpuCanonicalBackendId));
  const auto targets = targets_for(rows);
  const GradInputs g = patterned_grads(rows);
  for (DType dtype : {DType::bf16, DType::fp16, DType::fp32}) {
    const ContractOptions copt{.dtype = dtype, .active = {true, false, true, true, true}};
    const auto ref = tp1(op, make_logits(dtype, rows, kReal, kReal, 9), targets, copt, g);
    const VocabLayout ml = megatron_bounds(kReal, tp);
    const FullLogits logits = make_logits(dtype, rows, kReal, ml.padded_vocab_size, 9);
    check_rank(op, world, logits, ml.vocab_shard_bounds, targets, copt, g, ref,
               "even TP" + std::to_string(tp));
    // Uneven: the first rank takes a quarter of the tiles less than an even share.
    std::vector<VocabRange> uneven = ml.vocab_shard_bounds;
    const int64_t shift = (uneven[0].size() / 4 / 128) * 128;
    uneven[0].end -= shift;
    uneven[1].start -= shift;
    check_rank(op, world, logits, uneven, targets, copt, g, ref, "uneven TP" + std::to_string(tp));
  }
}

// Shard bounds that are not tile multiples: vLLM's layout (the vocabulary padded to 64, ranks of
// ceil(P / TP) columns: 37984 at TP 4), and a layout whose first rank holds no columns and
// whose second holds 100 columns inside one tile, the others splitting the rest unevenly.
TEST(MpiOperator, UnalignedBoundsBitwiseEqualTp1) {
  MpiComm world = MpiComm::world();
  const int64_t tp = world.size();
  const int64_t rows = 5;
  VocabParallelLogprob op(simd_kernels(), std::string(kCpuCanonicalBackendId));
  const auto targets = targets_for(rows);
  const GradInputs g = patterned_grads(rows);
  const int64_t padded = (kReal + 63) / 64 * 64;
  const int64_t per = (padded + tp - 1) / tp;
  std::vector<VocabRange> vllm, ragged;
  for (int64_t r = 0; r < tp; ++r) {
    vllm.push_back({std::min(r * per, padded), std::min((r + 1) * per, padded)});
  }
  ragged.push_back({0, 0});
  ragged.push_back({0, 100});
  for (int64_t r = 2, start = 100; r < tp; ++r) {
    const int64_t end = r + 1 == tp ? padded : start + 30001 * r;
    ragged.push_back({start, end});
    start = end;
  }
  if (tp == 2) ragged = {{0, 100}, {100, padded}};
  for (DType dtype : {DType::bf16, DType::fp32}) {
    const ContractOptions copt{.dtype = dtype, .active = {true, false, true, true, true}};
    const auto ref = tp1(op, make_logits(dtype, rows, kReal, kReal, 9), targets, copt, g);
    const FullLogits logits = make_logits(dtype, rows, kReal, padded, 9);
    check_rank(op, world, logits, vllm, targets, copt, g, ref, "vLLM TP" + std::to_string(tp));
    check_rank(op, world, logits, ragged, targets, copt, g, ref, "ragged TP" + std::to_string(tp));
  }
}

TEST(MpiOperator, TpTimesCpGroups) {
  MpiComm world = MpiComm::world();
  if (world.size() % 2 != 0) GTEST_SKIP() << "needs an even world";
  const int tp = 2, cp = world.size() / 2;
  MpiTpCpGroups groups = split_tp_cp(world, tp, cp);
  // Tokens are split contiguously across CP ranks; each CP rank's TP group scores its slice.
  const int64_t rows_total = 8, per = rows_total / cp;
  const int64_t first = groups.placement.cp_rank * per;
  VocabParallelLogprob op(simd_kernels(), std::string(kCpuCanonicalBackendId));
  const ContractOptions copt{.dtype = DType::bf16};
  const auto all_targets = targets_for(rows_total);
  const GradInputs all_g = patterned_grads(rows_total);
  const auto ref_all =
      tp1(op, make_logits(DType::bf16, rows_total, kReal, kReal, 4), all_targets, copt, all_g);
  // This CP rank's slice of the reference and of the inputs.
  const VocabLayout ml = megatron_bounds(kReal, tp);
  FullLogits full = make_logits(DType::bf16, rows_total, kReal, ml.padded_vocab_size, 4);
  FullLogits slice = full;
  slice.rows = per;
  slice.half.assign(full.half.begin() + first * full.cols,
                    full.half.begin() + (first + per) * full.cols);
  Local ref;
  auto cut = [&](const std::vector<float>& v) {
    return std::vector<float>(v.begin() + first, v.begin() + first + per);
  };
  ref.result.logp = cut(ref_all.result.logp);
  ref.result.lse = cut(ref_all.result.lse);
  ref.result.entropy = cut(ref_all.result.entropy);
  ref.grad = ref_all.grad;
  ref.grad.rows = per;
  ref.grad.half.assign(ref_all.grad.half.begin() + first * kReal,
                       ref_all.grad.half.begin() + (first + per) * kReal);
  const GradInputs g{cut(all_g.grad_logp), cut(all_g.grad_lse), cut(all_g.grad_entropy)};
  const std::vector<int64_t> targets(all_targets.begin() + first,
                                     all_targets.begin() + first + per);
  check_rank(op, groups.tp_group, slice, ml.vocab_shard_bounds, targets, copt, g, ref,
             "TP2 x CP" + std::to_string(cp));
}

TEST(MpiOperator, PreflightMismatchThrowsOnEveryRank) {
  MpiComm world = MpiComm::world();
  const int tp = world.size();
  const int64_t rows = 3;
  VocabParallelLogprob op(simd_kernels(), std::string(kCpuCanonicalBackendId));
  const VocabLayout ml = megatron_bounds(kReal, tp);
  const FullLogits logits = make_logits(DType::fp32, rows, kReal, ml.padded_vocab_size, 1);
  const Layout layout{kReal, ml.padded_vocab_size, ml.vocab_shard_bounds};
  const VocabRange b = ml.vocab_shard_bounds[static_cast<std::size_t>(world.rank())];
  for (bool validate : {true, false}) {
    // Tile widths differ (both align the Megatron bounds).
    const ContractOptions copt{.tile_width = world.rank() == 0 ? 64 : 128};
    const LogprobContract c = make_contract(layout, world.rank(), rows, copt);
    try {
      op.forward(logits.shard(b.start, b.end), targets_for(rows), c, world, {.validate = validate});
      ADD_FAILURE() << "rank " << world.rank() << " did not throw";
    } catch (const ContractError& e) {
      EXPECT_NE(std::string(e.what()).find("cross-rank preflight failed"), std::string::npos)
          << e.what();
    }
    // One rank's local validation fails (a target outside the real vocabulary): the others
    // fail with it instead of waiting.
    std::vector<int64_t> t = targets_for(rows);
    if (world.rank() == tp - 1) t[1] = kReal + 5;
    const LogprobContract c2 = make_contract(layout, world.rank(), rows, {});
    EXPECT_THROW(op.forward(logits.shard(b.start, b.end), t, c2, world, {.validate = true}),
                 ContractError);
  }
}

}  // namespace
}  // namespace detlogp::testing
