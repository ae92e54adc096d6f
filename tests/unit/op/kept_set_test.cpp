// Kept sets (ForwardOptions::kept, docs/numerics.md "Kept sets") through the logits operator on
// the in-process rank group: bitwise across TP degrees with uneven shards and changing padding,
// the caller's id order, row permutations, a row alone, thread counts, every SIMD target and the
// reference, with a softcap and per-row temperatures; the outputs are the canon's own on the kept
// row (a vocabulary of |S| columns); a float64 oracle; gradients only in kept columns; the
// outside mode; every bad input fails on every rank naming the row and the id.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include "detlogp/fused_dispatch.hpp"
#include "detlogp/registry.hpp"
#include "op_test_util.hpp"
#include "tp_compare.hpp"

namespace detlogp::testing {
namespace {

using ::testing::HasSubstr;

// Row i's temperature: a few values, 1 among them.
std::vector<float> temperatures_for(int64_t rows) {
  const float values[] = {0.7f, 1.0f, 1.9f, 0.25f, 3.0f};
  std::vector<float> t(static_cast<std::size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) t[static_cast<std::size_t>(i)] = values[i % 5];
  return t;
}

// tp_compare's expect_same, and every rank of `b` resolved the same kept sets as `a`.
void expect_same_kept(const TpRun& a, const TpRun& b, int64_t real, const std::string& what) {
  expect_same(a, b, real, what);
  for (const RankOutputs& r : b.ranks) {
    EXPECT_EQ(a.ranks[0].result.kept_ids, r.result.kept_ids) << what << ": kept_ids";
    EXPECT_EQ(a.ranks[0].result.kept_width, r.result.kept_width) << what << ": kept_width";
  }
}

// Shards of 1 + 5r tiles, the last one to the padded end.
Layout uneven(int64_t real, int64_t padded, int64_t tp, int64_t w) {
  Layout odd{real, padded, {}};
  int64_t start = 0;
  for (int64_t r = 0; r < tp; ++r) {
    const int64_t end = r + 1 == tp ? padded : start + (1 + 5 * r) * w;
    odd.bounds.push_back({start, end});
    start = end;
  }
  return odd;
}

// TP 1, 2, 4, 8 with even and uneven shards (the padded size changing with TP), the reference
// at TP 1 against the SIMD kernels; bf16 and fp32, with and without a softcap, per-row
// temperatures; sets of 1 to 1024 ids (several tiles of the kept row), ids in the caller's
// random order with the padding spread between them.
TEST(KeptSet, BitwiseAcrossTpDegreesKernelsAndIdOrder) {
  const int64_t real = 20000, rows = 7, w = 128, width = 1024;
  const auto targets = targets_for(rows, real, 13);
  const std::vector<int64_t> sizes = {1, 5, 128, 129, 300, 1024, 40};
  const auto ids = kept_for(targets, real, width, sizes, 14);
  const GradInputs grads{grads_for(rows, 15), grads_for(rows, 16), grads_for(rows, 17)};
  const std::vector<float> temps = temperatures_for(rows);
  const VocabParallelLogprob simd(simd_kernels(), "test-simd");
  const VocabParallelLogprob ref(reference_kernels(), "test-reference");
  const ForwardOptions fopt{.entropy = true,
                            .exec = {.threads = 2},
                            .row_temperature = temps,
                            .kept = {.ids = ids, .width = width}};
  // The same sets, each row in another order.
  std::vector<int64_t> reordered = ids;
  std::mt19937 gen(18);
  for (int64_t i = 0; i < rows; ++i) {
    std::shuffle(reordered.begin() + i * width, reordered.begin() + (i + 1) * width, gen);
  }
  ForwardOptions fopt2 = fopt;
  fopt2.kept.ids = reordered;
  for (DType dtype : {DType::bf16, DType::fp32}) {
    for (std::optional<float> cap : {std::optional<float>(), std::optional<float>(30.0f)}) {
      const ContractOptions copt{.dtype = dtype, .softcap = cap};
      const std::string what0 = std::string(to_string(dtype)) + (cap ? " cap" : "");
      const FullLogits base = make_logits(dtype, rows, real, real, 19, 20.0f);
      const Layout one{real, real, {{0, real}}};
      const TpRun want = run_tp(ref, base, one, targets, copt, fopt, grads);
      // Resolved: each row ascending, the padding last.
      const LogprobResult& r0 = want.ranks[0].result;
      ASSERT_EQ(r0.kept_width, width);
      for (int64_t i = 0; i < rows; ++i) {
        const auto first = r0.kept_ids.begin() + i * width;
        const int64_t n = sizes[static_cast<std::size_t>(i)];
        EXPECT_TRUE(std::is_sorted(first, first + n)) << i;
        EXPECT_TRUE(std::all_of(first + n, first + width, [](int64_t v) { return v == -1; }));
      }
      for (const std::string& t : simd_targets()) {
        const VocabParallelLogprob op(simd_kernels_for(t), "test-" + t);
        expect_same_kept(want, run_tp(op, base, one, targets, copt, fopt, grads), real,
                         what0 + " " + t);
      }
      expect_same_kept(want, run_tp(simd, base, one, targets, copt, fopt2, grads), real,
                       what0 + " reordered ids");
      for (int64_t tp : {2, 4, 8}) {
        const VocabLayout ml = megatron_bounds(real, tp);
        const FullLogits logits = make_logits(dtype, rows, real, ml.padded_vocab_size, 19, 20.0f);
        const Layout even{real, ml.padded_vocab_size, ml.vocab_shard_bounds};
        const Layout odd = uneven(real, ml.padded_vocab_size, tp, w);
        for (const Layout* layout : {&even, &odd}) {
          const std::string what =
              what0 + " TP " + std::to_string(tp) + (layout == &even ? " even" : " uneven");
          expect_same_kept(want, run_tp(simd, logits, *layout, targets, copt, fopt, grads), real,
                           what);
          expect_same_kept(want, run_tp(simd, logits, *layout, targets, copt, fopt2, grads), real,
                           what + " reordered ids");
        }
      }
    }
  }
}

// Rows permuted (logits, targets, sets, temperatures, gradients together), a row alone in its
// batch, and thread counts: each row keeps its bits.
TEST(KeptSet, EachRowKeepsItsBitsInAnyBatch) {
  const int64_t real = 3000, padded = 3072, rows = 9, width = 300;
  const Layout layout{real, padded, {{0, 1024}, {1024, padded}}};
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const FullLogits logits = make_logits(DType::bf16, rows, real, padded, 21, 15.0f);
  const auto targets = targets_for(rows, real, 22);
  const auto ids = kept_for(targets, real, width, {3, 300, 64, 200}, 23);
  const GradInputs grads{grads_for(rows, 24), grads_for(rows, 25), grads_for(rows, 26)};
  const std::vector<float> temps = temperatures_for(rows);
  const ContractOptions copt{.dtype = DType::bf16, .softcap = 9.0f};
  const auto fopt = [&](const std::vector<int64_t>& k, const std::vector<float>& t, int threads) {
    return ForwardOptions{.entropy = true,
                          .exec = {.threads = threads},
                          .row_temperature = t,
                          .kept = {.ids = k, .width = width}};
  };
  const TpRun batch = run_tp(op, logits, layout, targets, copt, fopt(ids, temps, 1), grads);
  for (int threads : {2, 3}) {
    expect_same_kept(batch,
                     run_tp(op, logits, layout, targets, copt, fopt(ids, temps, threads), grads),
                     real, "threads " + std::to_string(threads));
  }
  std::vector<int64_t> order(static_cast<std::size_t>(rows));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 gen(27);
  std::shuffle(order.begin(), order.end(), gen);
  const auto pids = take(ids, order, width);
  const auto ptemps = take(temps, order);
  const TpRun permuted = run_tp(
      op, take_rows(logits, order), layout, take(targets, order), copt, fopt(pids, ptemps, 2),
      {take(grads.grad_logp, order), take(grads.grad_lse, order), take(grads.grad_entropy, order)});
  for (int64_t i = 0; i < rows; ++i) {
    expect_row_same(permuted, i, batch, order[static_cast<std::size_t>(i)], real, "permuted");
  }
  for (int64_t i : {0, 5, 8}) {
    const auto idx = static_cast<std::size_t>(i);
    const auto one_ids = take(ids, {i}, width);
    const std::vector<float> t1 = {temps[idx]};
    const TpRun alone =
        run_tp(op, take_rows(logits, {i}), layout, {targets[idx]}, copt, fopt(one_ids, t1, 1),
               {{grads.grad_logp[idx]}, {grads.grad_lse[idx]}, {grads.grad_entropy[idx]}});
    expect_row_same(alone, 0, batch, i, real, "alone");
  }
}

// The outputs are the canon's own on the kept row: the operator without kept sets, called on
// an fp32 vocabulary of |S| columns holding the kept scores in ascending id order (tile width
// 128), gives the same logp, LSE, entropy and (on the kept columns) gradient bits.
TEST(KeptSet, IsTheCanonOfTheKeptRow) {
  const int64_t real = 5000, padded = 5120, rows = 6, width = 700;
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const FullLogits logits = make_logits(DType::fp32, rows, real, padded, 31, 8.0f);
  const auto targets = targets_for(rows, real, 32);
  const auto ids = kept_for(targets, real, width, {1, 7, 128, 130, 513, 700}, 33);
  const GradInputs grads{grads_for(rows, 34), grads_for(rows, 35), grads_for(rows, 36)};
  const Layout layout{real, padded, {{0, 2048}, {2048, padded}}};
  const TpRun run = run_tp(op, logits, layout, targets, {},
                           {.entropy = true, .kept = {.ids = ids, .width = width}}, grads);
  const LogprobResult& r = run.ranks[0].result;
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<int64_t> s(r.kept_ids.begin() + i * width, r.kept_ids.begin() + (i + 1) * width);
    s.erase(std::remove(s.begin(), s.end(), -1), s.end());
    const auto n = static_cast<int64_t>(s.size());
    FullLogits row;
    row.dtype = DType::fp32;
    row.rows = 1;
    row.cols = n;
    int64_t target_pos = -1;
    for (int64_t k = 0; k < n; ++k) {
      row.f32.push_back(logits.at(i, s[k]));
      if (s[k] == targets[i]) target_pos = k;
    }
    const auto idx = static_cast<std::size_t>(i);
    const TpRun plain = run_tp(
        op, row, Layout{n, n, {{0, n}}}, {target_pos}, {.tile_width = 128}, {.entropy = true},
        {{grads.grad_logp[idx]}, {grads.grad_lse[idx]}, {grads.grad_entropy[idx]}});
    const LogprobResult& p = plain.ranks[0].result;
    EXPECT_EQ(canon::bits_of(r.logp[i]), canon::bits_of(p.logp[0])) << "row " << i;
    EXPECT_EQ(canon::bits_of(r.lse[i]), canon::bits_of(p.lse[0])) << "row " << i;
    EXPECT_EQ(canon::bits_of(r.entropy[i]), canon::bits_of(p.entropy[0])) << "row " << i;
    for (int64_t k = 0; k < n; ++k) {
      ASSERT_EQ(canon::bits_of(run.grad.at(i, s[k])), canon::bits_of(plain.grad.at(0, k)))
          << "row " << i << " id " << s[k];
    }
  }
}

// Every column outside a row's kept set gets exactly +0 (real and padding columns alike),
// whatever it holds.
TEST(KeptSet, GradientOnlyInKeptColumns) {
  const int64_t real = 1000, padded = 1152, rows = 5, width = 40;
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  for (DType dtype : {DType::bf16, DType::fp16, DType::fp32}) {
    const FullLogits logits = make_logits(dtype, rows, real, padded, 41, 5.0f, NAN);
    const auto targets = targets_for(rows, real, 42);
    const auto ids = kept_for(targets, real, width, {1, 40, 17}, 43);
    const Layout layout{real, padded, {{0, 384}, {384, 768}, {768, padded}}};
    const TpRun run = run_tp(op, logits, layout, targets, {.dtype = dtype, .temperature = 0.8f},
                             {.entropy = true, .kept = {.ids = ids, .width = width}},
                             {grads_for(rows, 44), grads_for(rows, 45), grads_for(rows, 46)});
    const auto esz = dtype_size(dtype);
    for (int64_t i = 0; i < rows; ++i) {
      const std::set<int64_t> s(ids.begin() + i * width, ids.begin() + (i + 1) * width);
      int64_t nonzero = 0;
      for (int64_t c = 0; c < padded; ++c) {
        const auto* at = static_cast<const uint8_t*>(run.grad.data()) + (i * padded + c) * esz;
        const bool zero = std::all_of(at, at + esz, [](uint8_t b) { return b == 0; });
        if (!s.contains(c)) {
          ASSERT_TRUE(zero) << to_string(dtype) << " row " << i << " column " << c;
        } else {
          nonzero += zero ? 0 : 1;
        }
      }
      EXPECT_GT(nonzero, 0) << "row " << i;
    }
  }
}

// logp, LSE and entropy within the documented bounds of float64 softmax over S; the gradient
// close to the float64 gradient (grad_logp and grad_entropy); a set of the whole vocabulary is
// within the same bounds of the full-vocabulary outputs.
TEST(KeptSet, AccurateAgainstFloat64) {
  const int64_t real = 3000, padded = 3072, rows = 6, width = 1024;
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const FullLogits logits = make_logits(DType::fp32, rows, real, padded, 51, 8.0f);
  const auto targets = targets_for(rows, real, 52);
  const auto ids = kept_for(targets, real, width, {2, 50, 1000, 1024, 129, 700}, 53);
  const std::vector<float> temps = temperatures_for(rows);
  const Layout layout{real, padded, {{0, 1536}, {1536, padded}}};
  const std::vector<float> g_h = grads_for(rows, 54);
  const TpRun run =
      run_tp(op, logits, layout, targets, {},
             {.entropy = true, .row_temperature = temps, .kept = {.ids = ids, .width = width}},
             {.grad_logp = std::vector<float>(rows, 1.0f), .grad_entropy = g_h});
  const LogprobResult& r = run.ranks[0].result;
  const auto ulp = [](double v) { return std::ldexp(1.0, std::ilogb(v) - 23); };
  for (int64_t i = 0; i < rows; ++i) {
    const double tau = temps[static_cast<std::size_t>(i)];
    std::vector<int64_t> s;
    for (int64_t j = 0; j < width; ++j) {
      if (ids[i * width + j] >= 0) s.push_back(ids[i * width + j]);
    }
    double mx = -INFINITY;
    for (int64_t c : s) mx = std::max(mx, logits.at(i, c) / tau);
    double sum = 0.0, u = 0.0;
    for (int64_t c : s) {
      const double d = logits.at(i, c) / tau - mx;
      sum += std::exp(d);
      u += std::exp(d) * d;
    }
    const double lse = mx + std::log(sum);
    const double h = std::log(sum) - u / sum;
    const double logp = logits.at(i, targets[i]) / tau - lse;
    EXPECT_NEAR(r.lse[i], lse, ulp(lse) / 2 + 1e-5 + 4e-6 * std::abs(lse)) << "row " << i;
    EXPECT_NEAR(r.logp[i], logp, ulp(lse) / 2 + ulp(logp) / 2 + 1e-5 + 4e-6 * std::abs(lse))
        << "row " << i;
    EXPECT_NEAR(r.entropy[i], h, 1e-5 * std::max(1.0, std::abs(h))) << "row " << i;
    for (int64_t c : s) {
      const double z = logits.at(i, c) / tau;
      const double p = std::exp(z - lse);
      const double want = ((c == targets[i] ? 1.0 : 0.0) - p + g_h[i] * p * ((lse - z) - h)) / tau;
      EXPECT_NEAR(run.grad.at(i, c), want, 2e-5 / tau + 1e-5 * std::abs(want))
          << "row " << i << " column " << c;
    }
  }
  // The whole real vocabulary as the kept set: not the full-vocabulary tree, but within the
  // oracle's bound of its outputs.
  const int64_t small = 1000;
  const FullLogits few = make_logits(DType::fp32, 2, small, small, 55, 8.0f);
  std::vector<int64_t> all_ids;
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t c = small - 1; c >= 0; --c) all_ids.push_back(c);
  }
  const Layout solo{small, small, {{0, small}}};
  const std::vector<int64_t> t2 = {3, 999};
  const TpRun kept_all = run_tp(op, few, solo, t2, {},
                                {.entropy = true, .kept = {.ids = all_ids, .width = small}}, {});
  const TpRun full = run_tp(op, few, solo, t2, {}, {.entropy = true}, {});
  for (int64_t i = 0; i < 2; ++i) {
    const LogprobResult& a = kept_all.ranks[0].result;
    const LogprobResult& b = full.ranks[0].result;
    EXPECT_NEAR(a.lse[i], b.lse[i], 2e-5 * std::max(1.0f, std::abs(b.lse[i])));
    EXPECT_NEAR(a.logp[i], b.logp[i], 2e-5 * std::max(1.0f, std::abs(b.lse[i])));
    EXPECT_NEAR(a.entropy[i], b.entropy[i], 2e-5 * std::max(1.0f, std::abs(b.entropy[i])));
  }
}

// OutsideKept::neg_inf: a row whose target is outside its set gets logp = -inf and no logp
// gradient (the gradient of the same call with that row's grad_logp zero); its LSE and entropy
// are the set's. Inactive rows: logp +0, an empty list allowed, their targets not looked at.
TEST(KeptSet, OutsideTargetsAndInactiveRows) {
  const int64_t real = 600, padded = 640, rows = 4, width = 8;
  const Layout layout{real, padded, {{0, 256}, {256, padded}}};
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const FullLogits logits = make_logits(DType::fp32, rows, real, padded, 61);
  const std::vector<int64_t> targets = {5, 300, 7, -100};
  std::vector<int64_t> ids = {5,  9,  300, 1,  -1, -1, -1, -1,   // row 0: target kept
                              4,  2,  599, -1, -1, -1, -1, -1,   // row 1: target 300 outside
                              -1, 7,  8,   -1, -1, -1, -1, -1,   // row 2: inactive
                              -1, -1, -1,  -1, -1, -1, -1, -1};  // row 3: inactive, empty
  const ContractOptions copt{.active = {true, true, false, false}};
  const std::vector<float> gl = {0.5f, -2.0f, 3.0f, 1.0f};
  const std::vector<float> ge = {0.25f, 1.5f, -1.0f, 0.5f};
  const ForwardOptions fopt{.entropy = true,
                            .kept = {.ids = ids, .width = width, .outside = OutsideKept::neg_inf}};
  const TpRun run = run_tp(op, logits, layout, targets, copt, fopt, {gl, {}, ge});
  const LogprobResult& r = run.ranks[0].result;
  EXPECT_TRUE(std::isinf(r.logp[1]) && r.logp[1] < 0);
  EXPECT_EQ(canon::bits_of(r.logp[2]), 0u);
  EXPECT_EQ(canon::bits_of(r.logp[3]), 0u);
  EXPECT_TRUE(std::isfinite(r.lse[1]) && std::isfinite(r.lse[2]));
  EXPECT_TRUE(std::isinf(r.lse[3]) && r.lse[3] < 0);
  EXPECT_EQ(canon::bits_of(r.entropy[3]), 0u);
  std::vector<float> gl0 = gl;
  gl0[1] = 0.0f;
  const TpRun zeroed = run_tp(op, logits, layout, targets, copt, fopt, {gl0, {}, ge});
  EXPECT_EQ(real_grad_bytes(run.grad, real), real_grad_bytes(zeroed.grad, real));
  // With the default mode the same call is an error naming row 1 and target 300.
  ForwardOptions strict = fopt;
  strict.kept.outside = OutsideKept::error;
  const RankErrors errs = rank_errors(2, [&](Communicator& comm) {
    const int rk = comm.rank();
    const VocabRange b = layout.bounds[static_cast<std::size_t>(rk)];
    op.forward(logits.shard(b.start, b.end), targets, make_contract(layout, rk, rows, copt), comm,
               strict);
  });
  ASSERT_TRUE(errs.finished);
  for (const std::string& e : errs.errors) {
    EXPECT_THAT(e, HasSubstr("kept_ids row 1: target id 300 is not in the row's kept set"));
  }
}

// Every bad input, on one rank (code, field "kept_ids") and on one rank of two (every rank
// fails, the message naming the row and the id); ranks that disagree on the sets fail together.
TEST(KeptSet, BadInputsFailOnEveryRank) {
  const int64_t real = 256, rows = 3, width = 4;
  const Layout solo{real, real, {{0, real}}};
  const Layout two{real, real, {{0, 128}, {128, real}}};
  const FullLogits logits = make_logits(DType::fp32, rows, real, real, 3);
  const VocabParallelLogprob op(simd_kernels(), "test-simd");
  const std::vector<int64_t> targets = {0, 1, 2};
  const std::vector<int64_t> good = {0, 5, -1, -1, 1, -1, 7, 9, 2, 3, 4, 200};
  struct Case {
    std::vector<int64_t> ids;
    int64_t width;
    ErrorCode code;
    std::string text;
  };
  const auto with = [&](std::size_t at, int64_t v) {
    std::vector<int64_t> k = good;
    k[at] = v;
    return k;
  };
  const std::vector<Case> cases = {
      {std::vector<int64_t>(rows * (kMaxKeptIds + 1), -1), kMaxKeptIds + 1, ErrorCode::out_of_range,
       "width=1025"},
      {std::vector<int64_t>(good.begin(), good.end() - 1), width, ErrorCode::wrong_shape,
       "kept_ids has 11 ids"},
      {with(7, 256), width, ErrorCode::token_out_of_vocab, "row 1 holds id 256"},
      {with(7, -2), width, ErrorCode::token_out_of_vocab, "row 1 holds id -2"},
      {with(7, 1), width, ErrorCode::duplicate, "row 1 holds id 1 twice"},
      {{0, 5, -1, -1, -1, -1, -1, -1, 2, 3, 4, 200},
       width,
       ErrorCode::empty,
       "row 1 is an active row with no kept id"},
      {with(4, 11), width, ErrorCode::conflicting_fields, "row 1: target id 1 is not in"},
  };
  for (const Case& k : cases) {
    run_ranks(1, [&](Communicator& comm) {
      try {
        op.forward(logits.shard(0, real), targets, make_contract(solo, 0, rows, {}), comm,
                   {.kept = {.ids = k.ids, .width = k.width}});
        ADD_FAILURE() << "accepted: " << k.text;
      } catch (const ContractError& e) {
        EXPECT_EQ(e.code(), k.code) << e.what();
        EXPECT_EQ(e.field(), "kept_ids") << e.what();
        EXPECT_THAT(e.what(), HasSubstr(k.text));
      }
    });
    // Bad on rank 1 only: both ranks fail with its message.
    const RankErrors errs = rank_errors(2, [&](Communicator& comm) {
      const int r = comm.rank();
      const VocabRange b = two.bounds[static_cast<std::size_t>(r)];
      const std::vector<int64_t>& mine = r == 1 ? k.ids : good;
      op.forward(logits.shard(b.start, b.end), targets, make_contract(two, r, rows, {}), comm,
                 {.kept = {.ids = mine, .width = r == 1 ? k.width : width}});
    });
    ASSERT_TRUE(errs.finished) << k.text;
    for (const std::string& e : errs.errors) EXPECT_THAT(e, HasSubstr(k.text));
  }
  // An inactive row's list is checked too.
  run_ranks(1, [&](Communicator& comm) {
    const ContractOptions copt{.active = {true, false, true}};
    EXPECT_THROW(op.forward(logits.shard(0, real), targets, make_contract(solo, 0, rows, copt),
                            comm, {.kept = {.ids = with(7, 1), .width = width}}),
                 ContractError);
  });
  // Ranks with different sets, or one without: ranks_disagree, field kept_ids, on both.
  for (bool second_has_none : {false, true}) {
    const RankErrors errs = rank_errors(2, [&](Communicator& comm) {
      const int r = comm.rank();
      const VocabRange b = two.bounds[static_cast<std::size_t>(r)];
      const std::vector<int64_t> other = with(3, 100);
      ForwardOptions o;
      if (r == 0) o.kept = {.ids = good, .width = width};
      if (r == 1 && !second_has_none) o.kept = {.ids = other, .width = width};
      try {
        op.forward(logits.shard(b.start, b.end), targets, make_contract(two, r, rows, {}), comm, o);
      } catch (const ContractError& e) {
        EXPECT_EQ(e.code(), ErrorCode::ranks_disagree);
        EXPECT_EQ(e.field(), "kept_ids");
        throw;
      }
    });
    ASSERT_TRUE(errs.finished);
    for (const std::string& e : errs.errors) EXPECT_THAT(e, HasSubstr("kept sets"));
  }
  // The single-shard batch-invariant op has no kept sets.
  const BatchInvariantLogprob bi("test-bi");
  run_ranks(1, [&](Communicator& comm) {
    const LogprobContract c =
        make_contract(solo, 0, rows, {.scope = DeterminismScope::fixed_topology});
    try {
      bi.forward(logits.shard(0, real), targets, c, comm, {.kept = {.ids = good, .width = width}});
      ADD_FAILURE() << "accepted";
    } catch (const ContractError& e) {
      EXPECT_EQ(e.code(), ErrorCode::not_supported);
      EXPECT_EQ(e.field(), "kept_ids");
    }
  });
}

}  // namespace
}  // namespace detlogp::testing

namespace detlogp::testing {
namespace {

// Kernels whose shard is not host memory (as the CUDA kernels): they declare no kept sets.
class NoKeptSets final : public ShardKernels {
 public:
  std::string name() const override { return "no-kept-sets"; }
  void node_partials(const LogitsView& shard, const ShardSpec& spec,
                     std::span<const TreeNode> nodes, bool with_entropy, std::span<NodePartial> out,
                     const ExecOptions& exec) const override {
    simd_kernels().node_partials(shard, spec, nodes, with_entropy, out, exec);
  }
  void merge_roots(const TileGeometry& geometry, std::span<const TreeNode> nodes,
                   std::span<const NodePartial> partials, int64_t rows, RootsOut roots,
                   const ExecOptions& exec) const override {
    simd_kernels().merge_roots(geometry, nodes, partials, rows, roots, exec);
  }
  void backward(const LogitsView& shard, const ShardSpec& spec, const BackwardInputs& in,
                const MutableLogitsView& grad, const ExecOptions& exec) const override {
    simd_kernels().backward(shard, spec, in, grad, exec);
  }
  bool supports_kept_sets() const override { return false; }
};

// The capabilities say who has kept sets; kernels without them refuse a call on every rank.
TEST(KeptSet, CapabilityAndKernelsWithoutKeptSets) {
  EXPECT_TRUE(cpu_kernels_capability("canonical", "c", ImplementationKind::production)
                  .supports_kept_sets());
  EXPECT_TRUE(
      cpu_kernels_capability("reference", "r", ImplementationKind::reference).supports_kept_sets());
  EXPECT_FALSE(cpu_kernels_capability("batch_invariant", "b", ImplementationKind::production)
                   .supports_kept_sets());
  EXPECT_TRUE(fused_linear_logprob_capability().supports_kept_sets());
  EXPECT_THAT(cpu_kernels_capability("canonical", "c", ImplementationKind::production).to_json(),
              HasSubstr("\"supports_kept_sets\":true"));
  const NoKeptSets kernels;
  const VocabParallelLogprob op(kernels, "test-no-kept");
  const int64_t real = 256;
  const Layout two{real, real, {{0, 128}, {128, real}}};
  const FullLogits logits = make_logits(DType::fp32, 2, real, real, 3);
  const std::vector<int64_t> targets = {0, 1}, ids = {0, 1};
  const RankErrors errs = rank_errors(2, [&](Communicator& comm) {
    const int r = comm.rank();
    const VocabRange b = two.bounds[static_cast<std::size_t>(r)];
    op.forward(logits.shard(b.start, b.end), targets, make_contract(two, r, 2, {}), comm,
               {.kept = {.ids = ids, .width = 1}});
  });
  ASSERT_TRUE(errs.finished);
  for (const std::string& e : errs.errors) EXPECT_THAT(e, HasSubstr("supports_kept_sets false"));
}

}  // namespace
}  // namespace detlogp::testing
