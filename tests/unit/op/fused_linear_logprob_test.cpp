// FusedLinearLogprob: bitwise equal to VocabParallelLogprob on linear_logits, its gradients
// equal to the canon's sums computed here from the operator's logit gradient, and every output
// bitwise independent of the TP layout, threads, row blocks, kernels and batch composition.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "detlogp/fused.hpp"
#include "detlogp/operator.hpp"
#include "fused_test_util.hpp"
#include "numerics/linear_canon.hpp"

namespace detlogp::testing {
namespace {

constexpr int64_t kW = 16;  // tile width: 13 real tiles, a 16-leaf tree
constexpr int64_t kReal = 200;
constexpr int64_t kH = 37;  // not a multiple of 16: exercises the canon's zero padding
constexpr int64_t kRows = 7;

ContractOptions contract_options(float temperature = 1.0f,
                                 std::optional<float> softcap = std::nullopt) {
  return ContractOptions{.tile_width = kW, .temperature = temperature, .softcap = softcap};
}

std::vector<int64_t> make_targets(int64_t rows, uint32_t salt) {
  std::mt19937 gen(salt);
  std::uniform_int_distribution<int64_t> pick(0, kReal - 1);
  std::vector<int64_t> t(static_cast<std::size_t>(rows));
  for (auto& x : t) x = pick(gen);
  return t;
}

GradInputs make_grads(int64_t rows, bool entropy, uint32_t salt) {
  std::mt19937 gen(salt);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  GradInputs g;
  for (int64_t i = 0; i < rows; ++i) {
    g.grad_logp.push_back(normal(gen));
    g.grad_lse.push_back(normal(gen));
    if (entropy) g.grad_entropy.push_back(normal(gen));
  }
  return g;
}

struct Problem {
  FullLogits hidden;
  FullLogits weight;  // [padded of the widest layout, H]; rows >= kReal are garbage padding
  std::vector<int64_t> targets;
};

Problem make_problem(DType dtype, int64_t rows, int64_t padded, uint32_t salt) {
  Problem p{make_matrix(dtype, rows, kH, salt, 1.0f),
            make_matrix(dtype, padded, kH, salt + 1, 0.5f), make_targets(rows, salt + 2)};
  // Padding rows hold huge values: they must never contribute.
  for (int64_t r = kReal; r < padded; ++r) {
    for (int64_t c = 0; c < kH; ++c) {
      const std::size_t i = static_cast<std::size_t>(r * kH + c);
      if (dtype == DType::fp32) {
        p.weight.f32[i] = 3e4f;
      } else {
        p.weight.half[i] = dtype == DType::bf16 ? canon::float_to_bf16(3e4f) : 0x7bff;
      }
    }
  }
  return p;
}

// The canon's gradient sums, straight from their definitions, from the operator's fp32 logit
// gradient g [rows, padded].
struct CanonGrads {
  std::vector<float> hidden;  // [rows, H]
  std::vector<float> weight;  // [kReal, H]
};

std::optional<std::vector<float>> tree_sum(const std::vector<std::vector<float>>& tile_sums,
                                           int level, int64_t index) {
  const auto tiles = static_cast<int64_t>(tile_sums.size());
  if ((index << level) >= tiles) return std::nullopt;  // no real tile: absent
  if (level == 0) return tile_sums[static_cast<std::size_t>(index)];
  auto left = tree_sum(tile_sums, level - 1, 2 * index);
  auto right = tree_sum(tile_sums, level - 1, 2 * index + 1);
  if (!right) return left;
  for (std::size_t i = 0; i < left->size(); ++i) (*left)[i] = (*left)[i] + (*right)[i];
  return left;
}

CanonGrads canon_grads(const FullLogits& g, const FullLogits& hidden, const FullLogits& weight) {
  const int64_t rows = hidden.rows;
  CanonGrads out;
  out.weight.assign(static_cast<std::size_t>(kReal * kH), 0.0f);
  for (int64_t c = 0; c < kReal; ++c) {
    for (int64_t h = 0; h < kH; ++h) {
      float acc = 0.0f;
      for (int64_t i = 0; i < rows; ++i) acc = std::fma(g.at(i, c), hidden.at(i, h), acc);
      out.weight[c * kH + h] = acc;
    }
  }
  const int64_t tiles = (kReal + kW - 1) / kW;
  std::vector<std::vector<float>> tile_sums;
  for (int64_t t = 0; t < tiles; ++t) {
    std::vector<float> s(static_cast<std::size_t>(rows * kH), 0.0f);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t h = 0; h < kH; ++h) {
        float acc = 0.0f;
        for (int64_t c = t * kW; c < std::min((t + 1) * kW, kReal); ++c) {
          acc = std::fma(g.at(i, c), weight.at(c, h), acc);
        }
        s[i * kH + h] = acc;
      }
    }
    tile_sums.push_back(std::move(s));
  }
  int levels = 0;
  while ((int64_t{1} << levels) < tiles) ++levels;
  out.hidden = *tree_sum(tile_sums, levels, 0);
  return out;
}

std::vector<float> real_rows(const std::vector<float>& m, int64_t rows) {
  return std::vector<float>(m.begin(), m.begin() + rows * kH);
}

void expect_same_outputs(const FusedRun& a, const FusedRun& b, const std::string& what) {
  for (std::size_t r = 0; r < b.ranks.size(); ++r) {
    EXPECT_EQ(bits(a.ranks[0].logp), bits(b.ranks[r].logp)) << what << " rank " << r;
    EXPECT_EQ(bits(a.ranks[0].lse), bits(b.ranks[r].lse)) << what << " rank " << r;
    EXPECT_EQ(bits(a.ranks[0].entropy), bits(b.ranks[r].entropy)) << what << " rank " << r;
    if (!b.grad_hidden[r].empty()) {
      EXPECT_EQ(bits(a.grad_hidden[0]), bits(b.grad_hidden[r])) << what << " rank " << r;
    }
  }
  if (!a.grad_hidden[0].empty()) {
    EXPECT_EQ(bits(real_rows(a.grad_weight, kReal)), bits(real_rows(b.grad_weight, kReal))) << what;
  }
}

TEST(LinearLogits, EveryKernelGivesTheCanonicalDotProducts) {
  for (DType dt : {DType::fp32, DType::bf16, DType::fp16}) {
    for (int64_t hs : {1, 15, 16, 17, 40, 100}) {
      const FullLogits x = make_matrix(dt, 9, hs, 11, 1.0f);
      const FullLogits w = make_matrix(dt, 23, hs, 12, 1.0f);
      const FullLogits x32 = upcast(x);
      const FullLogits w32 = upcast(w);
      for (const std::string& k : fused_kernel_names()) {
        const FullLogits z = logits_of(x, w, k);
        for (int64_t i = 0; i < x.rows; ++i) {
          for (int64_t c = 0; c < w.rows; ++c) {
            const float want =
                canon::canonical_dot(x32.f32.data() + i * hs, w32.f32.data() + c * hs, hs);
            ASSERT_EQ(canon::bits_of(want), canon::bits_of(z.f32[i * w.rows + c]))
                << k << " " << to_string(dt) << " H=" << hs << " (" << i << ", " << c << ")";
          }
        }
      }
    }
  }
}

TEST(LinearLogits, EveryKernelGivesTheCanonicalDotProductsOnLargeBlocks) {
  // Blocks of 32 rows x 128 columns and H >= 512: AVX2's lane GEMM tile, beside a last row block
  // of 8 rows and a last column block of 72 (the smaller tiles' path); H not a multiple of 16.
  for (DType dt : {DType::fp32, DType::bf16}) {
    const int64_t hs = 520;
    const FullLogits x = make_matrix(dt, 40, hs, 13, 1.0f);
    const FullLogits w = make_matrix(dt, 200, hs, 14, 1.0f);
    const FullLogits x32 = upcast(x);
    const FullLogits w32 = upcast(w);
    for (const std::string& k : fused_kernel_names()) {
      const FullLogits z = logits_of(x, w, k);
      for (int64_t i = 0; i < x.rows; ++i) {
        for (int64_t c = 0; c < w.rows; ++c) {
          const float want =
              canon::canonical_dot(x32.f32.data() + i * hs, w32.f32.data() + c * hs, hs);
          ASSERT_EQ(canon::bits_of(want), canon::bits_of(z.f32[i * w.rows + c]))
              << k << " " << to_string(dt) << " (" << i << ", " << c << ")";
        }
      }
    }
  }
}

TEST(LinearLogits, RejectsMismatchedShapes) {
  const FullLogits x = make_matrix(DType::fp32, 2, 8, 1, 1.0f);
  const FullLogits w = make_matrix(DType::fp32, 3, 9, 2, 1.0f);
  std::vector<float> out(6);
  EXPECT_THROW(
      linear_logits(
          whole(x), whole(w),
          MutableLogitsView{
              .data = out.data(), .dtype = DType::fp32, .rows = 2, .cols = 3, .row_stride = 3}),
      ContractError);
  EXPECT_THROW(linear_logits(whole(x), whole(x), MutableLogitsView{}, {}, "no-such-kernel"),
               ContractError);
}

// The fused op equals VocabParallelLogprob on linear_logits' fp32 logits, and its gradients
// equal the canon's sums of that operator's logit gradient.
TEST(FusedLinearLogprob, EqualsTheOperatorOnLinearLogits) {
  for (DType dt : {DType::fp32, DType::bf16, DType::fp16}) {
    for (bool entropy : {false, true}) {
      for (float tau : {1.0f, 0.7f}) {
        const Layout layout = padded_layout(kReal, 1, kW);
        const Problem p = make_problem(dt, kRows, layout.padded, 21);
        const GradInputs grads = make_grads(kRows, entropy, 5);
        const FullLogits z = logits_of(p.hidden, p.weight);
        const VocabParallelLogprob op(reference_kernels(), "test-reference");
        ContractOptions copt = contract_options(tau);
        const TpRun want = run_tp(op, z, layout, p.targets, copt, {.entropy = entropy}, grads);
        const FusedRun got = run_fused(p.hidden, p.weight, layout, p.targets, copt,
                                       {.fused = {.entropy = entropy}, .grads = grads});
        const std::string what = std::string(to_string(dt)) + (entropy ? " entropy" : "") +
                                 " tau=" + std::to_string(tau);
        EXPECT_EQ(bits(want.ranks[0].result.logp), bits(got.ranks[0].logp)) << what;
        EXPECT_EQ(bits(want.ranks[0].result.lse), bits(got.ranks[0].lse)) << what;
        EXPECT_EQ(bits(want.ranks[0].result.entropy), bits(got.ranks[0].entropy)) << what;
        const CanonGrads cg = canon_grads(want.grad, p.hidden, p.weight);
        EXPECT_EQ(bits(cg.hidden), bits(got.grad_hidden[0])) << what;
        EXPECT_EQ(bits(cg.weight), bits(real_rows(got.grad_weight, kReal))) << what;
        for (int64_t i = kReal * kH; i < layout.padded * kH; ++i) {
          ASSERT_EQ(canon::bits_of(got.grad_weight[i]), 0u) << what << ": padding rows get +0";
        }
      }
    }
  }
}

// With a logit softcap: the fused op is the logits op on the linear logits (both capped), bit
// for bit, and invariant across TP layouts; the cap really changes the outputs.
TEST(FusedLinearLogprob, SoftcapEqualsTheOperatorOnLinearLogitsAcrossTp) {
  for (DType dt : {DType::fp32, DType::bf16}) {
    for (float tau : {1.0f, 0.7f}) {
      const Layout base = padded_layout(kReal, 1, kW);
      const std::vector<Layout> layouts = {padded_layout(kReal, 2, kW),
                                           uneven_layout(kReal, {3, 7, 3}, kW),
                                           padded_layout(kReal, 8, kW)};
      int64_t widest = base.padded;
      for (const Layout& l : layouts) widest = std::max(widest, l.padded);
      const Problem p = make_problem(dt, kRows, widest, 91);
      const GradInputs grads = make_grads(kRows, true, 9);
      const ContractOptions copt = contract_options(tau, 2.0f);
      const FullLogits z = logits_of(p.hidden, p.weight);
      const VocabParallelLogprob op(reference_kernels(), "test-reference");
      const Layout wide{kReal, widest, {{0, widest}}};
      const TpRun want = run_tp(op, z, wide, p.targets, copt, {.entropy = true}, grads);
      const FusedRunOptions o{.fused = {.entropy = true}, .grads = grads};
      const FusedRun got = run_fused(p.hidden, p.weight, base, p.targets, copt, o);
      const std::string what = std::string(to_string(dt)) + " tau=" + std::to_string(tau);
      EXPECT_EQ(bits(want.ranks[0].result.logp), bits(got.ranks[0].logp)) << what;
      EXPECT_EQ(bits(want.ranks[0].result.lse), bits(got.ranks[0].lse)) << what;
      EXPECT_EQ(bits(want.ranks[0].result.entropy), bits(got.ranks[0].entropy)) << what;
      const CanonGrads cg = canon_grads(want.grad, p.hidden, p.weight);
      EXPECT_EQ(bits(cg.hidden), bits(got.grad_hidden[0])) << what;
      EXPECT_EQ(bits(cg.weight), bits(real_rows(got.grad_weight, kReal))) << what;
      const FusedRun uncapped =
          run_fused(p.hidden, p.weight, base, p.targets, contract_options(tau), o);
      EXPECT_NE(bits(uncapped.ranks[0].lse), bits(got.ranks[0].lse)) << what;
      for (const Layout& l : layouts) {
        expect_same_outputs(got, run_fused(p.hidden, p.weight, l, p.targets, copt, o),
                            what + " TP=" + std::to_string(l.bounds.size()));
      }
      for (const std::string& k : fused_kernel_names()) {  // the reference and every target
        FusedRunOptions ok = o;
        ok.kernel = k;
        ok.fused.exec.threads = 3;
        expect_same_outputs(got, run_fused(p.hidden, p.weight, base, p.targets, copt, ok),
                            what + " kernel " + k);
      }
    }
  }
}

TEST(FusedLinearLogprob, BitwiseAcrossTpDegreesAndPaddedSizes) {
  for (DType dt : {DType::bf16, DType::fp32}) {
    const Layout base = padded_layout(kReal, 1, kW);
    const std::vector<Layout> layouts = {padded_layout(kReal, 2, kW),
                                         uneven_layout(kReal, {3, 7, 3}, kW),
                                         padded_layout(kReal, 4, kW), padded_layout(kReal, 8, kW),
                                         uneven_layout(kReal, {1, 1, 5, 6, 2}, kW)};
    int64_t widest = base.padded;
    for (const Layout& l : layouts) widest = std::max(widest, l.padded);
    const Problem p = make_problem(dt, kRows, widest, 31);
    const GradInputs grads = make_grads(kRows, true, 6);
    const FusedRunOptions o{.fused = {.entropy = true}, .grads = grads};
    const FusedRun ref = run_fused(p.hidden, p.weight, base, p.targets, contract_options(), o);
    for (const Layout& l : layouts) {
      const FusedRun got = run_fused(p.hidden, p.weight, l, p.targets, contract_options(), o);
      expect_same_outputs(ref, got,
                          std::string(to_string(dt)) + " TP=" + std::to_string(l.bounds.size()) +
                              " padded=" + std::to_string(l.padded));
    }
  }
}

TEST(FusedLinearLogprob, BitwiseAcrossThreadsRowBlocksAndKernels) {
  const Layout layout = padded_layout(kReal, 2, kW);
  const Problem p = make_problem(DType::bf16, 11, layout.padded, 41);
  const GradInputs grads = make_grads(11, true, 7);
  const FusedRun ref = run_fused(p.hidden, p.weight, layout, p.targets, contract_options(),
                                 {.kernel = "scalar-reference",
                                  .fused = {.entropy = true, .exec = {.threads = 1}},
                                  .grads = grads});
  for (const std::string& k : fused_kernel_names()) {
    for (int threads : {1, 2, 3, 7}) {
      for (int64_t rb : {1, 4, 32}) {
        const FusedRun got =
            run_fused(p.hidden, p.weight, layout, p.targets, contract_options(),
                      {.kernel = k,
                       .fused = {.entropy = true, .exec = {.threads = threads}, .row_block = rb},
                       .grads = grads});
        expect_same_outputs(
            ref, got, k + " threads=" + std::to_string(threads) + " rb=" + std::to_string(rb));
      }
    }
  }
}

TEST(FusedLinearLogprob, LargeTilesBitwiseAcrossKernelsAndTp) {
  // The op's default row block (32) and 128-column tiles at H = 520: AVX2 computes the logits
  // of full tiles with its lane GEMM, the last row block (8 rows) and the last tile (44 real
  // columns) with the smaller tiles' path; everything equals the scalar reference at TP 1.
  const int64_t rows = 40, hs = 520, real = 300, w = 128;
  const FullLogits hidden = make_matrix(DType::fp32, rows, hs, 61, 1.0f);
  const FullLogits weight = make_matrix(DType::fp32, 512, hs, 62, 0.1f);
  std::vector<int64_t> targets = make_targets(rows, 63);
  for (int64_t i = 0; i < rows; ++i) targets[i] = (targets[i] * 7 + i) % real;
  const GradInputs grads = make_grads(rows, true, 64);
  const ContractOptions c{.tile_width = w};
  const FusedRun ref = run_fused(hidden, weight, padded_layout(real, 1, w), targets, c,
                                 {.kernel = "scalar-reference",
                                  .fused = {.entropy = true, .exec = {.threads = 1}},
                                  .grads = grads});
  for (const std::string& k : fused_kernel_names()) {
    for (int tp : {1, 2}) {
      const FusedRun got = run_fused(
          hidden, weight, padded_layout(real, tp, w), targets, c,
          {.kernel = k, .fused = {.entropy = true, .exec = {.threads = 2}}, .grads = grads});
      const std::string what = k + " tp=" + std::to_string(tp);
      for (std::size_t r = 0; r < got.ranks.size(); ++r) {
        EXPECT_EQ(bits(ref.ranks[0].logp), bits(got.ranks[r].logp)) << what;
        EXPECT_EQ(bits(ref.ranks[0].lse), bits(got.ranks[r].lse)) << what;
        EXPECT_EQ(bits(ref.ranks[0].entropy), bits(got.ranks[r].entropy)) << what;
        EXPECT_EQ(bits(ref.grad_hidden[0]), bits(got.grad_hidden[r])) << what;
      }
      const std::vector<float> want(ref.grad_weight.begin(), ref.grad_weight.begin() + real * hs);
      const std::vector<float> have(got.grad_weight.begin(), got.grad_weight.begin() + real * hs);
      EXPECT_EQ(bits(want), bits(have)) << what;
    }
  }
}

// logp, LSE, entropy and grad_hidden of a row never depend on the other rows.
TEST(FusedLinearLogprob, RowAloneEqualsTheRowInABatch) {
  const Layout layout = uneven_layout(kReal, {5, 8}, kW);
  const int64_t rows = 9;
  const Problem p = make_problem(DType::fp16, rows, layout.padded, 51);
  const GradInputs grads = make_grads(rows, true, 8);
  const FusedRun batch = run_fused(p.hidden, p.weight, layout, p.targets, contract_options(),
                                   {.fused = {.entropy = true}, .grads = grads});
  for (int64_t i : {int64_t{0}, int64_t{4}, rows - 1}) {
    Problem one{make_matrix(DType::fp16, 1, kH, 1, 1.0f), p.weight, {p.targets[i]}};
    std::memcpy(one.hidden.half.data(), p.hidden.half.data() + i * kH, kH * sizeof(uint16_t));
    GradInputs g1{{grads.grad_logp[i]}, {grads.grad_lse[i]}, {grads.grad_entropy[i]}};
    const FusedRun alone = run_fused(one.hidden, one.weight, layout, one.targets,
                                     contract_options(), {.fused = {.entropy = true}, .grads = g1});
    for (std::size_t r = 0; r < alone.ranks.size(); ++r) {
      EXPECT_EQ(canon::bits_of(alone.ranks[r].logp[0]), canon::bits_of(batch.ranks[0].logp[i]));
      EXPECT_EQ(canon::bits_of(alone.ranks[r].lse[0]), canon::bits_of(batch.ranks[0].lse[i]));
      EXPECT_EQ(canon::bits_of(alone.ranks[r].entropy[0]),
                canon::bits_of(batch.ranks[0].entropy[i]));
      const std::vector<float> row(batch.grad_hidden[0].begin() + i * kH,
                                   batch.grad_hidden[0].begin() + (i + 1) * kH);
      EXPECT_EQ(bits(alone.grad_hidden[r]), bits(row)) << "row " << i;
    }
  }
}

TEST(FusedLinearLogprob, HalfInputsEqualTheirExactFp32Upcast) {
  const Layout layout = padded_layout(kReal, 2, kW);
  for (DType dt : {DType::bf16, DType::fp16}) {
    const Problem p = make_problem(dt, kRows, layout.padded, 61);
    const GradInputs grads = make_grads(kRows, true, 9);
    const FusedRunOptions o{.fused = {.entropy = true}, .grads = grads};
    const FusedRun half = run_fused(p.hidden, p.weight, layout, p.targets, contract_options(), o);
    const FusedRun full =
        run_fused(upcast(p.hidden), upcast(p.weight), layout, p.targets, contract_options(), o);
    expect_same_outputs(half, full, std::string(to_string(dt)) + " vs fp32 upcast");
  }
}

// Outputs in the input dtype are the fp32 results rounded once.
TEST(FusedLinearLogprob, Bf16GradientsAreTheFp32SumsRoundedOnce) {
  const Layout layout = padded_layout(kReal, 1, kW);
  const Problem p = make_problem(DType::bf16, kRows, layout.padded, 71);
  const GradInputs grads = make_grads(kRows, false, 10);
  const FusedRun f32 =
      run_fused(p.hidden, p.weight, layout, p.targets, contract_options(), {.grads = grads});
  const FusedLinearLogprob op;
  for (int64_t rb : {3, 32}) {  // chains finished per item (several row blocks) or per tile
    std::vector<uint16_t> gh(static_cast<std::size_t>(kRows * kH));
    std::vector<uint16_t> gw(static_cast<std::size_t>(layout.padded * kH), 0xffff);
    run_ranks(1, [&](Communicator& comm) {
      const LogprobContract c =
          make_contract(layout, 0, kRows, {.dtype = DType::bf16, .tile_width = kW});
      const auto res =
          op.forward(whole(p.hidden), whole(p.weight), p.targets, c, comm, {.row_block = rb});
      op.backward(res, {.grad_logp = grads.grad_logp, .grad_lse = grads.grad_lse},
                  MutableLogitsView{gh.data(), DType::bf16, kRows, kH, kH},
                  MutableLogitsView{gw.data(), DType::bf16, layout.padded, kH, kH}, comm);
    });
    for (std::size_t i = 0; i < gh.size(); ++i) {
      ASSERT_EQ(gh[i], canon::float_to_bf16(f32.grad_hidden[0][i])) << "rb=" << rb << " " << i;
    }
    for (std::size_t i = 0; i < gw.size(); ++i) {
      ASSERT_EQ(gw[i], canon::float_to_bf16(f32.grad_weight[i])) << "rb=" << rb << " " << i;
    }
  }
}

// Against float64 on the same (exactly widened) inputs.
TEST(FusedLinearLogprob, AccurateAgainstFloat64) {
  const Layout layout = padded_layout(kReal, 1, kW);
  const Problem p = make_problem(DType::bf16, kRows, layout.padded, 81);
  const GradInputs grads = make_grads(kRows, false, 11);
  const FusedRun got =
      run_fused(p.hidden, p.weight, layout, p.targets, contract_options(),
                {.fused = {.entropy = true}, .grads = {.grad_logp = grads.grad_logp}});
  double max_g = 0.0;
  for (int64_t i = 0; i < kRows; ++i) {
    std::vector<double> z(kReal);
    double m = -1e300;
    for (int64_t c = 0; c < kReal; ++c) {
      double s = 0.0;
      for (int64_t h = 0; h < kH; ++h) s += double(p.hidden.at(i, h)) * p.weight.at(c, h);
      z[c] = s;
      m = std::max(m, s);
    }
    double sum = 0.0, u = 0.0;
    for (int64_t c = 0; c < kReal; ++c) {
      sum += std::exp(z[c] - m);
      u += std::exp(z[c] - m) * (z[c] - m);
    }
    const double lse = m + std::log(sum);
    const double ent = std::log(sum) - u / sum;
    EXPECT_NEAR(got.ranks[0].lse[i], lse, 1e-5 * std::max(1.0, std::fabs(lse)));
    EXPECT_NEAR(got.ranks[0].logp[i], z[p.targets[i]] - lse, 1e-5 * std::max(1.0, std::fabs(lse)));
    EXPECT_NEAR(got.ranks[0].entropy[i], ent, 1e-5 * std::max(1.0, ent));
    for (int64_t h = 0; h < kH; ++h) {
      double gh = 0.0;
      for (int64_t c = 0; c < kReal; ++c) {
        const double pc = std::exp(z[c] - lse);
        gh += grads.grad_logp[i] * ((c == p.targets[i] ? 1.0 : 0.0) - pc) * p.weight.at(c, h);
      }
      max_g = std::max(max_g, std::fabs(gh));
      EXPECT_NEAR(got.grad_hidden[0][i * kH + h], gh, 1e-5 * (1.0 + std::fabs(gh)));
    }
  }
  EXPECT_GT(max_g, 0.0);
}

TEST(FusedLinearLogprob, RejectsBadInputsWithTheField) {
  const Layout layout = padded_layout(kReal, 1, kW);
  const Problem p = make_problem(DType::fp32, kRows, layout.padded, 91);
  const FusedLinearLogprob op;
  run_ranks(1, [&](Communicator& comm) {
    const LogprobContract c = make_contract(layout, 0, kRows, contract_options());
    const FullLogits narrow = make_matrix(DType::fp32, layout.padded, kH - 1, 1, 1.0f);
    EXPECT_THROW(op.forward(whole(p.hidden), whole(narrow), p.targets, c, comm), ContractError);
    EXPECT_THROW(op.forward(whole(p.hidden), row_range(p.weight, 0, kW), p.targets, c, comm),
                 ContractError);
    const FullLogits bf = make_matrix(DType::bf16, kRows, kH, 1, 1.0f);
    EXPECT_THROW(op.forward(whole(bf), whole(p.weight), p.targets, c, comm), ContractError);
    std::vector<int64_t> bad = p.targets;
    bad[1] = kReal;  // a padding column
    try {
      op.forward(whole(p.hidden), whole(p.weight), bad, c, comm);
      ADD_FAILURE() << "a target in the padding was accepted";
    } catch (const ContractError& e) {
      EXPECT_NE(std::string(e.what()).find("real vocabulary"), std::string::npos) << e.what();
    }
    const auto res = op.forward(whole(p.hidden), whole(p.weight), p.targets, c, comm);
    std::vector<float> gh(static_cast<std::size_t>(kRows * kH));
    EXPECT_THROW(
        op.backward(res, {}, MutableLogitsView{gh.data(), DType::fp32, kRows, kH + 1, kH + 1},
                    MutableLogitsView{}, comm),
        ContractError);
  });
  EXPECT_THROW(FusedLinearLogprob("no-such-kernel"), ContractError);
}

// The checks are the logits operator's (op/call_checks.hpp): each error says its code and field.
TEST(FusedLinearLogprob, ErrorsCarryTheirCodeAndField) {
  const Layout layout = padded_layout(kReal, 1, kW);
  const Problem p = make_problem(DType::fp32, kRows, layout.padded, 91);
  const FusedLinearLogprob op;
  auto expect_error = [](const auto& call, ErrorCode code, const std::string& field) {
    try {
      call();
      ADD_FAILURE() << "no error for " << field;
    } catch (const ContractError& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_EQ(e.field(), field) << e.what();
    }
  };
  run_ranks(1, [&](Communicator& comm) {
    const LogprobContract c = make_contract(layout, 0, kRows, contract_options());
    const FullLogits narrow = make_matrix(DType::fp32, layout.padded, kH - 1, 1, 1.0f);
    expect_error([&] { op.forward(whole(p.hidden), whole(narrow), p.targets, c, comm); },
                 ErrorCode::wrong_shape, "weight_shard");
    expect_error(
        [&] { op.forward(whole(p.hidden), row_range(p.weight, 0, kW), p.targets, c, comm); },
        ErrorCode::wrong_shape, "weight_shard");
    const FullLogits bf = make_matrix(DType::bf16, kRows, kH, 1, 1.0f);
    expect_error([&] { op.forward(whole(bf), whole(p.weight), p.targets, c, comm); },
                 ErrorCode::wrong_dtype, "hidden");
    std::vector<int64_t> bad = p.targets;
    bad[1] = kReal;
    expect_error([&] { op.forward(whole(p.hidden), whole(p.weight), bad, c, comm); },
                 ErrorCode::token_out_of_vocab, "target_ids");
    expect_error(
        [&] { op.forward(whole(p.hidden), whole(p.weight), p.targets, c, comm, {.row_block = 0}); },
        ErrorCode::out_of_range, "row_block");
    const auto res = op.forward(whole(p.hidden), whole(p.weight), p.targets, c, comm);
    expect_error([&] { op.backward(res, {.grad_lse = std::vector<float>(1)}, {}, {}, comm); },
                 ErrorCode::wrong_shape, "grad_lse");
  });
}

// An op over FusedKernels given directly is the op of that kernel's name.
TEST(FusedLinearLogprob, TakesAnyFusedKernels) {
  const Layout layout = padded_layout(kReal, 1, kW);
  const Problem p = make_problem(DType::fp32, kRows, layout.padded, 95);
  for (const std::string& k : fused_kernel_names()) {
    const FusedLinearLogprob by_name(k);
    const FusedLinearLogprob over(fused_kernels_for(k), "cpu-fused-linear-logp");
    EXPECT_EQ(over.kernel_name(), k);
    run_ranks(1, [&](Communicator& comm) {
      const LogprobContract c = make_contract(layout, 0, kRows, contract_options());
      const auto a = by_name.forward(whole(p.hidden), whole(p.weight), p.targets, c, comm);
      const auto b = over.forward(whole(p.hidden), whole(p.weight), p.targets, c, comm);
      EXPECT_EQ(bits(a.logp), bits(b.logp)) << k;
      EXPECT_EQ(bits(a.lse), bits(b.lse)) << k;
    });
  }
}

// A rank whose inputs fail fails every rank (through the preflight), never a hang.
TEST(FusedLinearLogprob, ALocalFailureFailsEveryRank) {
  const Layout layout = padded_layout(kReal, 2, kW);
  const Problem p = make_problem(DType::fp32, kRows, layout.padded, 93);
  const FusedLinearLogprob op;
  std::atomic<int> failures{0};
  run_ranks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    const LogprobContract c = make_contract(layout, r, kRows, contract_options());
    const VocabRange b = layout.bounds[r];
    const LogitsView w =
        r == 1 ? row_range(p.weight, b.start, b.end - 1) : row_range(p.weight, b.start, b.end);
    try {
      op.forward(whole(p.hidden), w, p.targets, c, comm);
    } catch (const ContractError&) {
      ++failures;
    }
  });
  EXPECT_EQ(failures.load(), 2);
}

// One rank in forward while the other is in backward: the preflight says so, on both ranks,
// instead of naming whichever field of the two calls happened to differ first.
TEST(FusedLinearLogprob, RanksInForwardAndBackwardAreToldSo) {
  const Layout layout = padded_layout(kReal, 2, kW);
  const Problem p = make_problem(DType::fp32, kRows, layout.padded, 95);
  const GradInputs grads = make_grads(kRows, false, 11);
  const FusedLinearLogprob op;
  std::vector<std::string> errors(2);
  run_ranks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    const LogprobContract c = make_contract(layout, r, kRows, contract_options());
    const VocabRange b = layout.bounds[r];
    const LogitsView w = row_range(p.weight, b.start, b.end);
    const auto res = op.forward(whole(p.hidden), w, p.targets, c, comm);
    std::vector<float> gh(static_cast<std::size_t>(kRows * kH));
    try {
      if (r == 0) {
        op.forward(whole(p.hidden), w, p.targets, c, comm);
      } else {
        op.backward(res, {.grad_logp = grads.grad_logp},
                    MutableLogitsView{gh.data(), DType::fp32, kRows, kH, kH}, {}, comm);
      }
    } catch (const ContractError& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("ranks are in different calls: rank 0 is in fused forward but rank 1 is in "
                     "fused backward"),
              std::string::npos)
        << e;
  }
}

}  // namespace
}  // namespace detlogp::testing
