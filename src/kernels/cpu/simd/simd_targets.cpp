// The SIMD kernels' per-target table: this file is compiled once per Highway target (it
// re-includes itself through hwy/foreach_target.h), and with it each algorithm, one file each,
// read top to bottom:
//
//   lanes-inl.h     vector types, fma, 2^n, the canon's lane folds
//   exp-inl.h       det_exp
//   convert-inl.h   widening of the logits, narrowing of the gradients
//   leaf-inl.h      the leaf partial of one tile
//   softcap-inl.h   det_tanh and the leaf partial of a capped tile
//   tree-inl.h      node_partials: leaves and the tree inside each node
//   backward-inl.h  backward
//   scalar-inl.h    the single-lane fallback target (the scalar canon itself)
//
// Every lane performs exactly the IEEE-754 operations of the scalar canon (numerics/canon.hpp)
// in the same order, so each target returns the canon's bits; tests/unit/kernels checks every
// target bitwise against the scalar reference.

#include <cstdint>
#include <vector>

#include "kernels/cpu/simd/simd_kernels.hpp"

// Targets: AVX-512 (AVX3), AVX2, SSE4 (no FMA: emulated per lane) and Highway's portable
// fallback (EMU128, or SCALAR where Highway marks EMU128 broken for the compiler, as with
// Debian 12's GCC 12). SSSE3-only CPUs use the fallback. Must be set before the first Highway
// header.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_AVX3_DL)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/simd/simd_targets.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway headers and the per-target files after foreach_target.h.
#include <hwy/highway.h>

#include "kernels/cpu/simd/backward-inl.h"
#include "kernels/cpu/simd/exp-inl.h"
#include "kernels/cpu/simd/scalar-inl.h"
#include "kernels/cpu/simd/softcap-inl.h"
#include "kernels/cpu/simd/tree-inl.h"

HWY_BEFORE_NAMESPACE();
namespace detlogp::simd {
namespace HWY_NAMESPACE {

// This target's entry points (exported below; one table entry per target).
const TargetOps* GetTargetOps() {
  static const TargetOps ops{HWY_TARGET,          hwy::TargetName(HWY_TARGET),
                             HWY_NATIVE_FMA != 0, &NodePartialsRows,
                             &BackwardRows,       &DetExpArray,
                             &DetTanhArray};
  return &ops;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace detlogp::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/simd/dispatch_table.h"

namespace detlogp::simd {

HWY_EXPORT(GetTargetOps);

std::vector<TargetOps> supported_target_ops() {
  std::vector<TargetOps> result;
  for_each_supported_target([&](int64_t target, std::size_t index) {
    const auto fn = HWY_DISPATCH_TABLE(GetTargetOps)[index];
    if (fn == nullptr) return;
    const TargetOps* ops = fn();
    if (ops->target != target) return;  // not this target's code: never hand it out
    result.push_back(*ops);
  });
  return result;
}

}  // namespace detlogp::simd
#endif  // HWY_ONCE
