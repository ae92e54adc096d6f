#pragma once
// What an operator's backward needs from its forward, kept alive by LogprobResult::saved.

#include <cstdint>
#include <vector>

#include "detlogp/kernels.hpp"

namespace detlogp {

struct SavedForward {
  enum class Producer { vocab_parallel, batch_invariant };
  Producer producer = Producer::vocab_parallel;  // backward only accepts its own op's results
  LogitsView logits;                             // referenced, never copied
  ShardSpec spec;                                // geometry the kernels ran with
  std::vector<float> row_temperature;            // what spec.row_temperature views (or empty)
  std::vector<int64_t> target_local;             // owned active target's local column, else -1
  std::vector<uint8_t> active;                   // 1 per active token
  bool has_entropy = false;
  bool entropy_grad = false;  // entropy computed and differentiable (ForwardOptions)
  const ShardKernels* kernels = nullptr;
  ExecOptions exec;
  std::vector<int64_t> kept;  // resolved kept ids [rows, kept_width] (empty: no kept sets)
  int64_t kept_width = 0;
  int64_t kept_begin = 0;  // global id of the shard's column 0
  int64_t real_vocab = 0;
  std::vector<uint8_t> outside_kept;  // 1 on active rows whose target is outside the kept set
  std::vector<uint8_t> full_rows;     // 1 on rows scored over the full vocabulary (mixed batch)
  std::vector<float> lse;             // copies of the forward outputs backward needs
  std::vector<float> entropy;
};

}  // namespace detlogp
