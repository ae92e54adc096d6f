#pragma once
// Reading Highway's per-target dispatch tables (HWY_EXPORT) directly, one entry per target,
// instead of HWY_DYNAMIC_DISPATCH: this selects a given target without changing Highway's
// global choice (no mutable state). Shared by the shard kernels (simd_targets.cpp) and the
// fused dense kernels (fused/dot_targets.cpp); include it in their HWY_ONCE section.

#include <cstddef>
#include <cstdint>

#include <hwy/highway.h>

namespace detlogp::simd {

// Calls fn(target, index) for every target compiled in and supported by this CPU, best first:
// `target` is the HWY_* bit, `index` its entry in an HWY_DISPATCH_TABLE.
template <class Fn>
void for_each_supported_target(const Fn& fn) {
  const int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  for (int64_t rest = targets; rest != 0; rest &= rest - 1) {
    const int64_t target = rest & -rest;  // lowest bit = best remaining target
    std::size_t index = 0;
#if (HWY_TARGETS & (HWY_TARGETS - 1)) != 0
    if (target == HWY_EMU128 || target == HWY_SCALAR) {
      index = HWY_MAX_DYNAMIC_TARGETS + 1;  // the fallback entry
    } else {
      index = hwy::Num0BitsBelowLS1Bit_Nonzero64(
          static_cast<uint64_t>(HWY_CHOSEN_TARGET_SHIFT(target)));
    }
#endif
    fn(target, index);
  }
}

}  // namespace detlogp::simd
