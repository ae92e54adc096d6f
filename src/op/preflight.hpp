#pragma once
// Cross-rank preflight: before any variable-size collective, every TP rank all-gathers one
// fixed-size record and compares it with everyone else's. Any disagreement (or a rank whose
// local validation failed) makes every rank throw ContractError("cross-rank preflight failed
// ..."), so no rank is ever stranded waiting in a later collective.

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"

namespace detlogp::op {

struct PreflightFacts {
  std::string fingerprint;       // contract.cross_rank_fingerprint()
  std::string backend_id;        // the backend actually running
  std::string numerics_version;  // kNumericsVersion of this build
  int64_t tile_width = 0;        // resolved W (0 when not deterministic: tiles unused)
  bool deterministic = true;
  bool entropy = false;     // decides the payload size of the next all-gather
  int64_t local_begin = 0;  // this rank's local tile range (deterministic) or columns
  int64_t local_end = 0;
  int64_t rows = 0;         // logits rows passed by this rank
  std::string rows_layout;  // ForwardOptions::rows_layout: which token each row is
  // The contract and targets of this call (null/empty for a rank that only reports a local
  // error): the record carries each contract part and a digest of the active targets, so a
  // mismatch names what differs. Both must outlive run_preflight.
  const LogprobContract* contract = nullptr;
  std::span<const int64_t> targets;
  // Set when this rank's local validation failed: the message, sent so the other ranks fail
  // together with it instead of waiting for it.
  std::optional<std::string> local_error;
};

// Size in bytes of one rank's record on the wire.
int64_t preflight_record_bytes();

// Runs the all-gather and the comparison. Returns normally only when every rank agrees and no
// rank failed locally; otherwise throws ContractError on every rank. The rank whose local
// validation failed rethrows its own message. Ranks whose rows layouts differ are reported
// first, with field "rows_layout" (every other difference follows from it).
void run_preflight(Communicator& comm, const PreflightFacts& mine);

}  // namespace detlogp::op
