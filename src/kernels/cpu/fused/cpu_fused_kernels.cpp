// The CPU fused kernels by name: one CpuFusedKernels per dense-kernel target (the scalar
// reference with the reference shard kernels, each Highway target with the SIMD shard kernels),
// built once.
#include "kernels/cpu/fused/cpu_fused_kernels.hpp"

#include <fmt/format.h>

#include <memory>

#include "detlogp/errors.hpp"

namespace detlogp {
namespace {

using fused::CpuFusedKernels;
using fused::DotOps;

const CpuFusedKernels& reference_fused() {
  static const CpuFusedKernels k(fused::reference_dot_ops(), reference_kernels());
  return k;
}

// One per SIMD target, best first (fused::simd_dot_ops' order).
const std::vector<std::unique_ptr<const CpuFusedKernels>>& simd_fused() {
  static const auto all = [] {
    std::vector<std::unique_ptr<const CpuFusedKernels>> v;
    for (const DotOps& ops : fused::simd_dot_ops()) {
      v.push_back(std::make_unique<const CpuFusedKernels>(ops, simd_kernels()));
    }
    return v;
  }();
  return all;
}

}  // namespace

const FusedKernels& fused_kernels_for(std::string_view kernel) {
  if (kernel.empty() || kernel == "simd") return *simd_fused().front();
  if (kernel == "scalar-reference" || kernel == "reference") return reference_fused();
  std::string known = reference_fused().name();
  for (const auto& k : simd_fused()) {
    const std::string name = k->name();
    if (name == kernel || name == "highway:" + std::string(kernel)) return *k;
    known += ", " + name;
  }
  throw ContractError(fmt::format(
      "kernel '{}' is not available in this build on this CPU; pass one of: {} (or empty for the "
      "best SIMD target)",
      kernel, known));
}

std::vector<std::string> fused_kernel_names() {
  std::vector<std::string> names{reference_fused().name()};
  for (const auto& k : simd_fused()) names.push_back(k->name());
  return names;
}

}  // namespace detlogp
