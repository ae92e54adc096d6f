// A C++ user's program against the installed package (find_package(detlogp), a project declared
// with CXX only, no MPI): TP=1 forward with entropy and backward through the registry, checked
// against a float64 computation of the same rows.
#include <cmath>
#include <cstdio>
#include <vector>

#include <detlogp/detlogp.hpp>

#include "problem.hpp"

int main() {
  using consumer::kReal;
  using consumer::kRows;
  const detlogp::VocabLayout layout = detlogp::megatron_bounds(kReal, 1);
  const int64_t padded = layout.padded_vocab_size;
  const std::vector<float> z = consumer::logits(padded);
  const std::vector<int64_t> t = consumer::targets();
  const detlogp::LogprobContract contract = consumer::contract(layout, 0);

  detlogp::DispatchResult backend = detlogp::get_logprob_op(contract);
  detlogp::SelfComm comm;
  const detlogp::LogitsView view{.data = z.data(),
                                 .dtype = detlogp::DType::fp32,
                                 .rows = kRows,
                                 .cols = padded,
                                 .row_stride = padded};
  const detlogp::LogprobResult out =
      backend.op->forward(view, t, contract, comm, {.entropy = true});
  const std::vector<float> ones(kRows, 1.0f);
  std::vector<float> grad(z.size());
  backend.op->backward(out, {.grad_logp = ones},
                       {.data = grad.data(),
                        .dtype = detlogp::DType::fp32,
                        .rows = kRows,
                        .cols = padded,
                        .row_stride = padded});

  int failures = 0;
  for (int64_t i = 0; i < kRows; ++i) {
    double m = -INFINITY, s = 0.0, grad_sum = 0.0;
    for (int64_t j = 0; j < kReal; ++j) m = std::fmax(m, z[i * padded + j]);
    for (int64_t j = 0; j < kReal; ++j) s += std::exp(z[i * padded + j] - m);
    const double lse = m + std::log(s);
    const double logp = z[i * padded + t[i]] - lse;
    // d logp / dz = onehot(target) - softmax(z): every row of the gradient sums to 0.
    for (int64_t j = 0; j < padded; ++j) grad_sum += grad[i * padded + j];
    if (std::fabs(out.lse[i] - lse) > 1e-5 || std::fabs(out.logp[i] - logp) > 1e-5 ||
        std::fabs(grad_sum) > 1e-5 || !(out.entropy[i] > 0.0f)) {
      std::printf("row %lld: lse %.7f (float64 %.7f) logp %.7f (float64 %.7f) grad sum %g\n",
                  static_cast<long long>(i), out.lse[i], lse, out.logp[i], logp, grad_sum);
      ++failures;
    }
  }
  std::printf("detlogp %s, backend %s: %lld rows forward+backward, %d failures\n",
              std::string(detlogp::version()).c_str(), backend.actual_backend.c_str(),
              static_cast<long long>(kRows), failures);
  return failures == 0 ? 0 : 1;
}
