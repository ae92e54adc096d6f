// Accuracy of the scalar reference kernels against long double (the accuracy goals), and the
// backward formula against finite differences of the double-precision loss.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "detlogp/kernels.hpp"
#include "numerics/canon.hpp"
#include "testing/logits_gen.hpp"
#include "testing/shard_pipeline.hpp"

namespace detlogp {
namespace {

using namespace testing;  // the generators and the shard pipeline

const ShardKernels& ref() { return reference_kernels(); }

struct RowRef {
  long double lse, entropy;
  std::vector<long double> p;
};

// LSE, entropy (= sum p (LSE - z)) and softmax of z[0, real) in long double.
RowRef row_reference(const Logits& z, int64_t r, int64_t real) {
  long double m = -INFINITY;
  for (int64_t c = 0; c < real; ++c) m = std::max<long double>(m, z.get(r, c));
  long double s = 0;
  for (int64_t c = 0; c < real; ++c) s += std::exp(static_cast<long double>(z.get(r, c)) - m);
  RowRef out;
  out.lse = m + std::log(s);
  out.entropy = 0;
  out.p.resize(static_cast<size_t>(real));
  for (int64_t c = 0; c < real; ++c) {
    const long double zc = z.get(r, c);
    const long double p = std::exp(zc - out.lse);
    out.p[static_cast<size_t>(c)] = p;
    out.entropy += p * (out.lse - zc);
  }
  return out;
}

// fp32 rows with |z| <= 50: uniform, normal, peaked (one dominant logit, p near 1), two-peaked.
Logits accuracy_logits(int64_t rows, int64_t padded, int64_t real, std::mt19937_64& rng,
                       std::vector<int64_t>* targets) {
  Logits x(DType::fp32, rows, padded);
  std::uniform_real_distribution<float> u50(-50.0f, 50.0f);
  std::uniform_real_distribution<float> low(-50.0f, 0.0f);
  std::normal_distribution<float> n3(0.0f, 3.0f);
  std::uniform_int_distribution<int64_t> col(0, real - 1);
  targets->clear();
  for (int64_t r = 0; r < rows; ++r) {
    const int kind = static_cast<int>(r % 4);
    for (int64_t c = 0; c < real; ++c) {
      float v = kind == 0 ? u50(rng) : kind == 1 ? n3(rng) : low(rng);
      x.set(r, c, std::fmax(-50.0f, std::fmin(50.0f, v)));
    }
    const int64_t t = col(rng);
    if (kind == 2) x.set(r, t, 50.0f);  // peaked at the target
    if (kind == 3) {
      x.set(r, t, 49.0f);
      x.set(r, col(rng), 49.5f);
    }
    targets->push_back(r % 5 == 4 ? -1 : t);  // some inactive rows
  }
  testing::fill_padding_garbage(x, real);
  return x;
}

struct AccuracyCase {
  int64_t real, padded, width, rows;
  float tau;
};

TEST(ReferenceAccuracy, AgainstLongDouble) {
  std::mt19937_64 rng(31);
  for (const AccuracyCase& a :
       {AccuracyCase{1000, 1024, 128, 40, 1.0f}, AccuracyCase{1000, 1008, 48, 20, 1.0f},
        AccuracyCase{1000, 1024, 128, 20, 0.7f}, AccuracyCase{151936, 152064, 128, 4, 1.0f}}) {
    SCOPED_TRACE(::testing::Message() << "R=" << a.real << " W=" << a.width << " tau=" << a.tau);
    const TileGeometry g{a.real, a.width};
    std::vector<int64_t> targets;
    const Logits x = accuracy_logits(a.rows, a.padded, a.real, rng, &targets);
    // z = fp32(x) / tau, rounded once as the canon does: the reference starts from these z.
    Logits z(DType::fp32, a.rows, a.padded);
    for (int64_t r = 0; r < a.rows; ++r) {
      for (int64_t c = 0; c < a.padded; ++c) z.set(r, c, canon::scale_logit(x.get(r, c), a.tau));
    }
    const std::vector<int64_t> cuts = testing::make_cuts(a.padded, a.width, 4, false, rng);
    const ForwardResult f = testing::forward_sharded(ref(), x, g, cuts, a.tau, true, targets);
    GradInputs grads;
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    for (int64_t r = 0; r < a.rows; ++r) {
      grads.grad_logp.push_back(targets[static_cast<size_t>(r)] >= 0 ? u(rng) : 0.0f);
      grads.grad_lse.push_back(u(rng));
      grads.grad_entropy.push_back(u(rng));
    }
    const Logits grad = testing::backward_sharded(ref(), x, g, cuts, a.tau, targets, f, grads);
    // The same backward without grad_logp: inactive rows (g_logp = 0) must be bitwise equal
    // (no logp gradient there), and still carry the LSE and entropy gradients.
    GradInputs no_logp = grads;
    no_logp.grad_logp.clear();
    const Logits grad_nl = testing::backward_sharded(ref(), x, g, cuts, a.tau, targets, f, no_logp);

    double worst_lse = 0, worst_logp = 0, worst_h = 0, worst_g = 0;
    for (int64_t r = 0; r < a.rows; ++r) {
      const auto ri = static_cast<size_t>(r);
      const RowRef want = row_reference(z, r, a.real);
      const long double lse_tol = 4e-6L * std::max<long double>(1, std::fabs(want.lse));
      const long double e_lse = std::fabs(f.lse[ri] - want.lse);
      EXPECT_LE(e_lse, lse_tol) << "row " << r;
      worst_lse = std::max<double>(worst_lse, static_cast<double>(e_lse / lse_tol));
      const long double h_tol = 1e-5L * std::max<long double>(1, want.entropy);
      const long double e_h = std::fabs(f.entropy[ri] - want.entropy);
      EXPECT_LE(e_h, h_tol) << "row " << r;
      worst_h = std::max<double>(worst_h, static_cast<double>(e_h / h_tol));
      const int64_t t = targets[ri];
      if (t >= 0) {
        const long double logp = static_cast<long double>(z.get(r, t)) - want.lse;
        const long double e = std::fabs(f.logp[ri] - logp);
        EXPECT_LE(e, 1e-5L) << "row " << r;
        worst_logp = std::max<double>(worst_logp, static_cast<double>(e / 1e-5L));
      } else {
        EXPECT_EQ(bits(f.logp[ri]), 0u);  // inactive: exactly 0
      }
      const long double gl = grads.grad_logp[ri], gL = grads.grad_lse[ri],
                        gH = grads.grad_entropy[ri];
      for (int64_t c = 0; c < a.padded; ++c) {
        if (c >= a.real) {
          ASSERT_EQ(grad.raw(r, c), 0u);
          continue;
        }
        const long double p = want.p[static_cast<size_t>(c)];
        const long double zc = z.get(r, c);
        long double gz =
            gl * ((c == t ? 1 : 0) - p) + gL * p + gH * p * (want.lse - zc - want.entropy);
        gz /= a.tau;
        const long double tol = 1e-6L + 1e-5L * std::fabs(gz);
        const long double e = std::fabs(grad.get(r, c) - gz);
        ASSERT_LE(e, tol) << "row " << r << " col " << c << " got " << grad.get(r, c) << " want "
                          << static_cast<double>(gz);
        worst_g = std::max<double>(worst_g, static_cast<double>(e / tol));
        if (t < 0) {
          ASSERT_EQ(grad.raw(r, c), grad_nl.raw(r, c)) << "inactive row " << r << " col " << c;
        }
      }
    }
    // Worst error as a fraction of its tolerance (informative).
    std::printf("R=%ld W=%ld tau=%.2f worst/tolerance: lse %.3f logp %.3f entropy %.3f grad %.3f\n",
                static_cast<long>(a.real), static_cast<long>(a.width), a.tau, worst_lse, worst_logp,
                worst_h, worst_g);
  }
}

// The double-precision loss L = a logp + b LSE + c H of z = x / tau (x in double).
double loss(const std::vector<double>& x, int64_t target, double tau, double a, double b,
            double c) {
  double m = -INFINITY;
  for (double v : x) m = std::max(m, v / tau);
  double s = 0;
  for (double v : x) s += std::exp(v / tau - m);
  const double lse = m + std::log(s);
  double h = 0;
  for (double v : x) h += std::exp(v / tau - lse) * (lse - v / tau);
  const double logp = target >= 0 ? x[static_cast<size_t>(target)] / tau - lse : 0.0;
  return a * logp + b * lse + c * h;
}

TEST(ReferenceAccuracy, GradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(32);
  std::normal_distribution<float> n1(0.0f, 1.5f);
  const int64_t real = 7, padded = 8;
  const TileGeometry g{real, 4};
  for (float tau : {1.0f, 0.8f}) {
    for (int64_t target : {int64_t{2}, int64_t{6}, int64_t{-1}}) {
      Logits x(DType::fp32, 1, padded);
      std::vector<double> xd;
      for (int64_t c = 0; c < real; ++c) {
        x.set(0, c, n1(rng));
        xd.push_back(x.get(0, c));
      }
      x.set(0, 7, 1e4f);  // padding
      const double a = target >= 0 ? 0.9 : 0.0, b = -0.6, c = 1.3;
      const std::vector<int64_t> targets{target};
      const std::vector<int64_t> cuts{0, 1, 2};
      const ForwardResult f = testing::forward_sharded(ref(), x, g, cuts, tau, true, targets);
      const GradInputs grads{
          {static_cast<float>(a)}, {static_cast<float>(b)}, {static_cast<float>(c)}};
      const Logits grad = testing::backward_sharded(ref(), x, g, cuts, tau, targets, f, grads);
      for (int64_t k = 0; k < real; ++k) {
        const double h = 1e-5;
        std::vector<double> xp = xd, xm = xd;
        xp[static_cast<size_t>(k)] += h;
        xm[static_cast<size_t>(k)] -= h;
        const double fd =
            (loss(xp, target, tau, a, b, c) - loss(xm, target, tau, a, b, c)) / (2 * h);
        EXPECT_NEAR(grad.get(0, k), fd, 2e-5)
            << "tau " << tau << " target " << target << " col " << k;
      }
      EXPECT_EQ(grad.raw(0, 7), 0u);
    }
  }
}

}  // namespace
}  // namespace detlogp
