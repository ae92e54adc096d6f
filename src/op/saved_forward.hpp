#pragma once
// What an operator's backward needs from its forward, kept alive by LogprobResult::saved.

#include <cstdint>
#include <vector>

#include "detlogp/kernels.hpp"

namespace detlogp {

struct SavedForward {
  LogitsView logits;                  // referenced, never copied
  ShardSpec spec;                     // geometry the kernels ran with
  std::vector<int64_t> target_local;  // owned active target's local column, else -1
  std::vector<uint8_t> active;        // 1 per active token
  bool has_entropy = false;
  const ShardKernels* kernels = nullptr;
  ExecOptions exec;
};

}  // namespace detlogp
