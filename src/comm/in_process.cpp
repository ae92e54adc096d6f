// InProcessGroup: ranks as threads of one process.
//
// Every collective is two rounds of a generation-counted rendezvous under one mutex:
//   1. each rank posts (op, send pointer, byte count) in its slot and waits for the others;
//   2. each rank checks that all slots agree, copies the other ranks' send buffers straight
//      into its recv, then waits at the second round, so that no send buffer is released
//      while another rank may still read it.
// Every rank reads the same slots, so every rank reaches the same verdict and always runs both
// rounds: the round count never drifts between ranks. Waiting is a condition-variable wait,
// never a spin. An abort wakes every waiter; a completed round wins over an abort that comes
// after it, so ranks that finished a collective together also return from it together.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/errors.hpp"

namespace detlogp {

namespace {

enum class Op : std::uint8_t { none, all_gather, barrier };

const char* op_name(Op op) {
  switch (op) {
    case Op::all_gather:
      return "all_gather";
    case Op::barrier:
      return "barrier";
    case Op::none:
      break;
  }
  return "nothing";
}

struct Slot {
  Op op = Op::none;
  const std::byte* data = nullptr;
  std::size_t bytes = 0;
};

// "rank 2" or "ranks 0, 3".
std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

}  // namespace

struct InProcessGroup::State {
  State(int n, InProcessOptions opt)
      : size(n), options(opt), slots(n), arrived_at(n, 0), departed(n, false) {}

  const int size;
  const InProcessOptions options;

  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t generation = 0;           // rounds completed
  int arrived = 0;                        // ranks waiting in the current round
  std::vector<Slot> slots;                // posted by each rank for the current collective
  std::vector<std::uint64_t> arrived_at;  // generation + 1 when the rank arrived, else stale
  std::vector<bool> departed;             // rank's function returned (run() only)
  int departed_count = 0;
  bool aborted = false;
  std::string abort_reason;

  // Requires mu held.
  void abort_locked(const std::string& reason) {
    if (aborted) return;
    aborted = true;
    abort_reason = "in-process rank group aborted: " + reason;
    cv.notify_all();
  }

  std::vector<int> missing_locked() const {
    std::vector<int> out;
    for (int r = 0; r < size; ++r) {
      if (arrived_at[r] != generation + 1) out.push_back(r);
    }
    return out;
  }

  std::vector<int> departed_locked() const {
    std::vector<int> out;
    for (int r = 0; r < size; ++r) {
      if (departed[r]) out.push_back(r);
    }
    return out;
  }

  // One rendezvous round for `rank`. Returns when all ranks arrived; throws
  // std::runtime_error if the group is or becomes aborted first.
  void round(std::unique_lock<std::mutex>& lk, int rank, Op op) {
    if (aborted) throw std::runtime_error(abort_reason);
    round_arrive_or_wait(lk, rank, op, /*abortable=*/true);
  }

  // The second round of a collective whose first round completed: every rank is already past
  // the first round and only copying, so this round always completes. It ignores aborts (a rank
  // leaving early here would free a send buffer another rank is still copying from).
  void closing_round(std::unique_lock<std::mutex>& lk, int rank, Op op) {
    round_arrive_or_wait(lk, rank, op, /*abortable=*/false);
  }

  void round_arrive_or_wait(std::unique_lock<std::mutex>& lk, int rank, Op op, bool abortable) {
    if (abortable && departed_count > 0) {
      abort_locked("rank " + std::to_string(rank) + " entered " + op_name(op) + " but " +
                   rank_list(departed_locked()) + " already returned from its function");
      throw std::runtime_error(abort_reason);
    }
    const std::uint64_t gen = generation;
    arrived_at[rank] = gen + 1;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    if (!abortable) {
      cv.wait(lk, [&] { return generation != gen; });
      return;
    }
    auto done = [&] { return generation != gen || aborted; };
    if (options.collective_timeout.count() > 0) {
      if (!cv.wait_for(lk, options.collective_timeout, done)) {
        abort_locked("rank " + std::to_string(rank) + " timed out after " +
                     std::to_string(options.collective_timeout.count()) + " ms in " + op_name(op) +
                     " waiting for " + rank_list(missing_locked()));
      }
    } else {
      cv.wait(lk, done);
    }
    if (generation != gen) return;  // completed (possibly just before an abort)
    // Leave the round: this rank no longer counts as arrived.
    --arrived;
    arrived_at[rank] = 0;
    throw std::runtime_error(abort_reason);
  }

  void leave(int rank) {
    std::lock_guard<std::mutex> lk(mu);
    if (departed[rank]) return;
    departed[rank] = true;
    ++departed_count;
    if (arrived > 0) {
      std::vector<int> waiting;
      for (int r = 0; r < size; ++r) {
        if (arrived_at[r] == generation + 1) waiting.push_back(r);
      }
      abort_locked("rank " + std::to_string(rank) + " returned from its function while " +
                   rank_list(waiting) + " wait(s) in a collective");
    }
  }
};

namespace {

class InProcessComm final : public Communicator {
 public:
  InProcessComm(std::shared_ptr<InProcessGroup::State> state, int rank)
      : state_(std::move(state)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return state_->size; }
  std::string name() const override { return "in-process"; }

  void barrier() override { collective(Op::barrier, {}, {}, false); }

 protected:
  void do_all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                     bool in_place) override {
    collective(Op::all_gather, send, recv, in_place);
  }

 private:
  // Detects two threads using one rank's communicator at once.
  class BusyGuard {
   public:
    explicit BusyGuard(InProcessComm& c) : c_(c) {
      if (c_.busy_.exchange(true)) {
        throw ContractError("in-process rank " + std::to_string(c_.rank_) +
                            ": two threads entered a collective on the same rank's "
                            "communicator; each rank's communicator belongs to one thread");
      }
    }
    ~BusyGuard() { c_.busy_.store(false); }
    BusyGuard(const BusyGuard&) = delete;
    BusyGuard& operator=(const BusyGuard&) = delete;

   private:
    InProcessComm& c_;
  };

  void collective(Op op, std::span<const std::byte> send, std::span<std::byte> recv,
                  bool in_place) {
    BusyGuard guard(*this);
    InProcessGroup::State& st = *state_;
    std::unique_lock<std::mutex> lk(st.mu);
    st.slots[rank_] = Slot{op, send.data(), send.size()};
    st.round(lk, rank_, op);
    lk.unlock();

    // Every rank sees the same slots here (nobody posts again before round two completes).
    std::string mismatch;
    const Slot& mine = st.slots[rank_];
    for (int r = 0; r < st.size && mismatch.empty(); ++r) {
      const Slot& other = st.slots[r];
      if (other.op != st.slots[0].op) {
        mismatch = "in-process collective mismatch: rank 0 called " +
                   std::string(op_name(st.slots[0].op)) + " but rank " + std::to_string(r) +
                   " called " + op_name(other.op) +
                   "; every rank must call the same collectives in the same order";
      } else if (other.bytes != st.slots[0].bytes) {
        mismatch = "in-process all_gather size mismatch: rank 0 sends " +
                   std::to_string(st.slots[0].bytes) + " bytes but rank " + std::to_string(r) +
                   " sends " + std::to_string(other.bytes) +
                   "; every rank must send the same number of bytes";
      }
    }
    if (mismatch.empty() && op == Op::all_gather && mine.bytes > 0) {
      const std::size_t n = mine.bytes;
      for (int r = 0; r < st.size; ++r) {
        if (r == rank_ && in_place) continue;
        std::memcpy(recv.data() + static_cast<std::size_t>(r) * n, st.slots[r].data, n);
      }
    }

    lk.lock();
    st.closing_round(lk, rank_, op);
    lk.unlock();
    if (!mismatch.empty()) throw ContractError(mismatch);
  }

  std::shared_ptr<InProcessGroup::State> state_;
  const int rank_;
  std::atomic<bool> busy_{false};
};

}  // namespace

InProcessGroup::InProcessGroup(int size, InProcessOptions options) {
  if (size < 1) {
    throw ContractError("InProcessGroup: size must be >= 1; got " + std::to_string(size));
  }
  if (size > kMaxInProcessRanks) {
    throw ContractError("InProcessGroup: size " + std::to_string(size) + " exceeds the limit of " +
                        std::to_string(kMaxInProcessRanks) +
                        " ranks (threads of one process; the memory of a collective grows with "
                        "the square of the size): use fewer TP ranks, or MPI");
  }
  if (options.collective_timeout.count() < 0) {
    throw ContractError("InProcessGroup: collective_timeout must be >= 0 (0 = no limit)");
  }
  state_ = std::make_shared<State>(size, options);
  comms_.reserve(size);
  for (int r = 0; r < size; ++r) comms_.push_back(std::make_unique<InProcessComm>(state_, r));
}

InProcessGroup::~InProcessGroup() = default;

int InProcessGroup::size() const { return state_->size; }

Communicator& InProcessGroup::comm(int rank) {
  if (rank < 0 || rank >= state_->size) {
    throw ContractError("InProcessGroup::comm: rank " + std::to_string(rank) + " is outside [0, " +
                        std::to_string(state_->size) + ")");
  }
  return *comms_[rank];
}

void InProcessGroup::abort(int rank, const std::string& reason) {
  std::lock_guard<std::mutex> lk(state_->mu);
  state_->abort_locked("rank " + std::to_string(rank) + " failed: " + reason);
}

bool InProcessGroup::aborted() const {
  std::lock_guard<std::mutex> lk(state_->mu);
  return state_->aborted;
}

void InProcessGroup::run(const std::function<void(Communicator&)>& fn) {
  State& st = *state_;
  {
    std::lock_guard<std::mutex> lk(st.mu);
    if (st.aborted) {
      throw ContractError("InProcessGroup::run: the group was aborted (" + st.abort_reason +
                          "); create a new group");
    }
    if (st.arrived > 0) {
      throw ContractError("InProcessGroup::run: ranks are still waiting in a collective");
    }
    st.departed.assign(st.size, false);
    st.departed_count = 0;
  }

  std::mutex first_mu;
  std::exception_ptr first;
  auto body = [&](int r) {
    try {
      fn(*comms_[r]);
    } catch (...) {
      std::string what = "unknown exception";
      try {
        throw;
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      {
        std::lock_guard<std::mutex> lk(first_mu);
        if (!first) first = std::current_exception();
      }
      abort(r, what);
      return;
    }
    st.leave(r);
  };

  std::vector<std::thread> threads;
  threads.reserve(st.size);
  try {
    for (int r = 0; r < st.size; ++r) threads.emplace_back(body, r);
  } catch (const std::exception& e) {
    abort(static_cast<int>(threads.size()), std::string("could not start its thread: ") + e.what());
    for (auto& t : threads) t.join();
    throw;
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

void run_ranks(int n, const std::function<void(Communicator&)>& fn, InProcessOptions options) {
  InProcessGroup group(n, options);
  group.run(fn);
}

}  // namespace detlogp
