#pragma once
// One row's inputs of the canon's logit gradient (numerics/canon.hpp, grad_element), read from
// the backward inputs of the host kernels: a gradient that was not supplied is absent (its
// term is left out), never a zero.

#include <cstdint>

#include "detlogp/kernels.hpp"
#include "numerics/canon.hpp"

namespace detlogp::kernels {

inline canon::GradCoefficients grad_coefficients(const BackwardInputs& in, int64_t row) {
  const auto r = static_cast<std::size_t>(row);
  canon::GradCoefficients g{};
  g.has_logp = !in.grad_logp.empty();
  g.has_lse = !in.grad_lse.empty();
  g.has_entropy = !in.grad_entropy.empty();
  g.g_logp = g.has_logp ? in.grad_logp[r] : 0.0f;
  g.g_lse = g.has_lse ? in.grad_lse[r] : 0.0f;
  g.g_entropy = g.has_entropy ? in.grad_entropy[r] : 0.0f;
  return g;
}

}  // namespace detlogp::kernels
