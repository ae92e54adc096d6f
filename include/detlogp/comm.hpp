#pragma once
// Communicators: the byte-moving layer under the vocab-parallel operator.
//
// A Communicator is a small handle on a group of ranks (in the spirit of NCCL's ncclComm_t):
// it knows its rank and the group size, all-gathers equal-size byte buffers and synchronises
// at a barrier. That is all. It never adds, averages or compares floats: every reduction of
// the numerics canon happens in the operator, on every rank, in the same order (see
// docs/numerics.md, "Distribution"), so the bits do not depend on the transport.
//
// Transports:
//   SelfComm          size 1; all_gather copies send into recv.
//   InProcessGroup    n ranks as n threads of one process (tests, CLI embedded default).
//   MpiComm           Open MPI, in <detlogp/mpi_comm.hpp> and the detlogp::mpi library.
//
// Collectives are called by every rank of the group in the same order (as in MPI and NCCL).
// A rank's communicator is used by one thread at a time.
//
// No collective waits forever: the in-process group and MpiComm give up after a collective
// timeout (kDefaultCollectiveTimeout unless configured), like NCCL's watchdog, and every rank
// still waiting gets std::runtime_error naming the collective, the rank(s) that did not arrive
// where the transport knows them, and the timeout.

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace detlogp {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "self", "in-process" or "mpi".
  virtual std::string name() const = 0;

  // Every rank contributes send.size() bytes (the same number on every rank); afterwards
  // recv holds rank r's bytes at [r * send.size(), (r + 1) * send.size()) on every rank.
  // recv.size() must equal size() * send.size(). send may be exactly this rank's block of
  // recv (in place); any other overlap of send and recv is an error. Zero bytes is allowed
  // (it still synchronises). Throws ContractError for a precondition this rank can see
  // (sizes, overlap) and, where the transport can detect it, for ranks that disagree on the
  // size or on which collective they called; std::runtime_error for transport failures.
  void all_gather(std::span<const std::byte> send, std::span<std::byte> recv);

  // Returns once every rank of the group has entered the barrier.
  virtual void barrier() = 0;

 protected:
  Communicator() = default;
  Communicator(const Communicator&) = default;
  Communicator& operator=(const Communicator&) = default;

  // Called by all_gather after the local checks. in_place: send is this rank's block of recv.
  virtual void do_all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                             bool in_place) = 0;
};

// Typed convenience: all_gather of trivially copyable values (recv.size() == size * send.size()).
template <class T>
requires std::is_trivially_copyable_v<T>
void all_gather(Communicator& comm, std::span<const T> send, std::span<T> recv) {
  comm.all_gather(std::as_bytes(send), std::as_writable_bytes(recv));
}

// The group of one.
class SelfComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "self"; }
  void barrier() override {}

 protected:
  void do_all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                     bool in_place) override;
};

// How long a rank waits in one collective for the others by default (every transport: the
// in-process group, MpiComm, the Python torch.distributed one, the CLI). The operator's
// collectives happen inside one call, which TP ranks reach within the skew of a training step
// (the model's own TP collectives just before the lm_head keep them in step); two minutes
// covers a slow first call (lazy device and allocator set-up, a JIT compile, a rank reading
// its inputs) with margin, and still reports a rank that never joins within two minutes
// (docs/comm.md, "Collective timeout"). Configurable per communicator; 0 means no limit.
inline constexpr std::chrono::milliseconds kDefaultCollectiveTimeout = std::chrono::seconds(120);
// The same in seconds (the unit of the CLI's --collective-timeout and of Python's timeout=).
inline constexpr double kDefaultCollectiveTimeoutSeconds =
    std::chrono::duration<double>(kDefaultCollectiveTimeout).count();

// The largest in-process group. Every rank is a thread of this process, and one all-gather
// holds size blocks in each of the size ranks' receive buffers, so the memory of a collective
// grows with the square of the size; no vocab-parallel layout needs more ranks than this.
inline constexpr int kMaxInProcessRanks = 64;

struct InProcessOptions {
  // How long one rank waits in a collective for the others before it aborts the group.
  // Zero: no limit (a rank that throws or returns still wakes the others; see run()).
  std::chrono::milliseconds collective_timeout = kDefaultCollectiveTimeout;
};

// A rank group whose ranks are threads of this process. comm(r) is the communicator of the
// thread playing rank r. The group never leaves a rank waiting forever:
//   - abort(r, reason) (called by run() when rank r's function throws) wakes every rank
//     waiting in a collective, and makes every later collective throw, with
//     std::runtime_error "in-process rank group aborted: rank r failed: <reason>";
//   - under run(), a rank whose function returns while others wait in a collective (or
//     before they enter one) aborts the group the same way;
//   - a rank that waits longer than the collective_timeout aborts the group: every waiting
//     rank gets "in-process rank group aborted: rank r timed out after T ms in <collective>
//     waiting for rank m".
// ContractError for a size outside [1, kMaxInProcessRanks] or a negative timeout.
// Each collective copies straight from the other ranks' send buffers: no staging copy.
// Ranks that call different collectives, or all_gather different sizes, all get a
// ContractError naming both ranks.
class InProcessGroup {
 public:
  explicit InProcessGroup(int size, InProcessOptions options = {});
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int size() const;
  Communicator& comm(int rank);

  // Runs fn(comm(r)) for every rank r on its own thread, joins them all and rethrows the
  // first exception (in time) a rank threw; the other ranks then see the abort. A group can
  // run several times unless a run failed (an aborted group stays aborted).
  void run(const std::function<void(Communicator&)>& fn);

  // Marks the group failed because of `rank`; wakes every waiter. Idempotent (the first
  // reason stays). Safe from any thread.
  void abort(int rank, const std::string& reason);
  bool aborted() const;

  struct State;  // internal

 private:
  std::shared_ptr<State> state_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

// InProcessGroup(n, options).run(fn).
void run_ranks(int n, const std::function<void(Communicator&)>& fn, InProcessOptions options = {});

// The rank map of a TP x CP (x DP) layout (the usual Megatron order): TP groups are
// contiguous blocks of tp ranks; then CP; DP outermost.
//   tp_rank = r % tp,  cp_rank = (r / tp) % cp,  dp_rank = r / (tp * cp).
struct RankPlacement {
  int tp = 1, cp = 1, dp = 1;
  int tp_rank = 0, cp_rank = 0, dp_rank = 0;
  // Members of this rank's TP group: world ranks [tp_group_first, tp_group_first + tp).
  int tp_group_first = 0;
  // Members of this rank's CP group: world ranks cp_group_first + k * tp, k in [0, cp).
  int cp_group_first = 0;
};

// ContractError if tp or cp < 1, world_rank is outside [0, world_size), or world_size is not
// a multiple of tp * cp (message contains "does not match TP*CP").
RankPlacement place_rank(int world_rank, int world_size, int tp, int cp = 1);

}  // namespace detlogp
