#pragma once
// Cross-rank preflight: before any variable-size collective, every TP rank all-gathers one
// fixed-size record and compares it with everyone else's. Any disagreement (or a rank whose
// local validation failed) makes every rank throw ContractError("cross-rank preflight failed
// ..."), so no rank is ever stranded waiting in a later collective.

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/kept_set.hpp"

namespace detlogp::op {

// The call a rank is in, compared before anything else: ranks in different calls are told so.
inline constexpr std::string_view kForwardPhase = "forward";
inline constexpr std::string_view kFusedForwardPhase = "fused forward";
inline constexpr std::string_view kFusedBackwardPhase = "fused backward";
inline constexpr std::string_view kSamplePhase = "sample";

struct PreflightFacts {
  // One of the k*Phase names; empty for a rank that only reports its failure or has no
  // tokens (it joins whichever call its peers make).
  std::string_view phase;
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
  // The call's per-row temperatures (empty: none); the record carries a digest of them. Must
  // outlive run_preflight.
  std::span<const float> row_temperature;
  // The call's kept sets (ForwardOptions::kept; none when not given); the record carries a
  // digest of each row's set (not of the order of its ids) and the outside mode. Must outlive
  // run_preflight.
  KeptSetOptions kept;
  // The call's per-row top_k and top_p of recomputed kept sets (empty: none); the record
  // carries a digest of each. Must outlive run_preflight.
  std::span<const int32_t> top_k;
  std::span<const float> top_p;
  // The sampler's per-row seeds and positions (empty: none; the record carries a digest of
  // each) and its num_logprobs (detlogp/sampler.hpp). Must outlive run_preflight.
  std::span<const int64_t> seeds;
  std::span<const int64_t> positions;
  int64_t num_logprobs = 0;
  // Set when this rank's local validation failed: the message, sent so the other ranks fail
  // together with it instead of waiting for it.
  std::optional<std::string> local_error;
};

// The facts of a deterministic call of `phase` on this rank: the contract's fingerprint, the
// build's numerics version, the tile width, this rank's tile range and row count. The caller
// adds what its call compares beyond them.
PreflightFacts call_facts(std::string_view phase, const LogprobContract& c, std::string backend_id,
                          bool entropy, int64_t rows);

// Size in bytes of one rank's record on the wire.
int64_t preflight_record_bytes();

// Runs the all-gather and the comparison. Returns normally only when every rank agrees and no
// rank failed locally; otherwise throws ContractError on every rank. The rank whose local
// validation failed rethrows its own message. Ranks whose rows layouts differ are reported
// first, with field "rows_layout" (every other difference follows from it); ranks whose per-row
// temperatures differ next, with field "temperature"; ranks whose kept sets differ next, with
// field "kept_ids"; ranks whose top_k or top_p differ next, with field "top_k" or "top_p";
// ranks whose seeds, positions or num_logprobs differ last, with that field.
void run_preflight(Communicator& comm, const PreflightFacts& mine);

// An operator call's first two steps: this rank's local checks, then, whenever the call is
// collective (tp_world_size > 1 or a communicator of several ranks, whatever `validate` says),
// the preflight with `facts`. A failed check (ContractError) throws at once with a communicator
// of one rank; otherwise its message travels in the preflight, so that every other rank fails
// with it instead of waiting for this one, and this rank rethrows its own error (code and field
// kept).
void check_then_preflight(Communicator& comm, int64_t tp_world_size, PreflightFacts facts,
                          const std::function<void()>& local_checks);

// Runs one collective step of an operator call. A transport failure (std::runtime_error: a
// timeout, a peer that went away, an aborted group) is rethrown as std::runtime_error
// "<step>: <the transport's message>", so the message says where in the call it happened
// before the transport says why. ContractError passes unchanged.
template <class F>
void collective_step(std::string_view step, F&& collective) {
  try {
    collective();
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string(step) + ": " + e.what());
  }
}

}  // namespace detlogp::op
