// SelfComm, the in-process rank group and the TP x CP rank map.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/errors.hpp"
#include "testing/comm_payload.hpp"

namespace detlogp {
namespace {

using namespace std::chrono_literals;

using testing::all_gather_in_place;
using testing::payload;
using testing::payload_byte;

// Checks recv == concat of payload(round, r, n) for r in [0, ranks). Returns a description of
// the first difference (empty if none), so it can be called from rank threads.
std::string check_gathered(const std::vector<std::byte>& recv, int round, int ranks,
                           std::size_t n) {
  if (recv.size() != n * ranks) return "recv size " + std::to_string(recv.size());
  for (int r = 0; r < ranks; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      if (recv[r * n + i] != payload_byte(round, r, i)) {
        return "round " + std::to_string(round) + " block " + std::to_string(r) + " byte " +
               std::to_string(i);
      }
    }
  }
  return {};
}

// Runs fn on a separate thread; if it takes longer than limit the group hangs, and the test
// binary aborts at once (a std::async future would block in its destructor, so merely failing
// the assertion would hang anyway).
template <class F>
void within(std::chrono::seconds limit, F fn) {
  auto fut = std::async(std::launch::async, fn);
  if (fut.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "%s: timed out after %lld s: the rank group hangs\n",
                 ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                 static_cast<long long>(limit.count()));
    std::fflush(stderr);
    std::abort();
  }
  fut.get();
}

// ---------------------------------------------------------------------------------------------
// SelfComm

TEST(SelfComm, RankSizeName) {
  SelfComm c;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.name(), "self");
  c.barrier();
}

TEST(SelfComm, AllGatherCopies) {
  SelfComm c;
  for (std::size_t n : {0u, 1u, 7u, 4096u}) {
    auto send = payload(0, 0, n);
    std::vector<std::byte> recv(n, std::byte{0xEE});
    c.all_gather(send, recv);
    EXPECT_EQ(check_gathered(recv, 0, 1, n), "") << n;
  }
}

TEST(SelfComm, InPlaceAndTyped) {
  SelfComm c;
  std::vector<std::byte> buf = payload(3, 0, 16);
  c.all_gather(std::span<const std::byte>(buf), std::span<std::byte>(buf));
  EXPECT_EQ(check_gathered(buf, 3, 1, 16), "");

  std::vector<float> f = {1.5f, -2.0f};
  std::vector<float> out(2);
  all_gather<float>(c, f, out);
  EXPECT_EQ(out, f);
}

TEST(SelfComm, SizeMismatchIsContractError) {
  SelfComm c;
  std::vector<std::byte> send(8), recv(7);
  EXPECT_THROW(c.all_gather(send, recv), ContractError);
  std::vector<std::byte> recv_big(16);
  EXPECT_THROW(c.all_gather(send, recv_big), ContractError);
}

TEST(SelfComm, PartialOverlapIsContractError) {
  SelfComm c;
  std::vector<std::byte> buf(16);
  std::span<std::byte> all(buf);
  // send = bytes [4, 12), recv = bytes [0, 8): overlapping, not in place.
  EXPECT_THROW(c.all_gather(all.subspan(4, 8), all.subspan(0, 8)), ContractError);
}

// ---------------------------------------------------------------------------------------------
// InProcessGroup: correctness

TEST(InProcess, RankSizeName) {
  for (int n = 1; n <= 8; ++n) {
    std::vector<std::atomic<int>> seen(n);
    run_ranks(n, [&](Communicator& c) {
      EXPECT_EQ(c.size(), n);
      EXPECT_EQ(c.name(), "in-process");
      seen[c.rank()].fetch_add(1);
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(seen[r].load(), 1) << "n=" << n << " rank " << r;
  }
}

TEST(InProcess, AllGatherRankDistinctPayloads) {
  const std::size_t sizes[] = {0, 1, 3, 8, 1000, 65536 + 5};
  for (int n = 1; n <= 8; ++n) {
    for (std::size_t bytes : sizes) {
      within(60s, [&] {
        run_ranks(n, [&](Communicator& c) {
          auto send = payload(0, c.rank(), bytes);
          std::vector<std::byte> recv(bytes * n, std::byte{0xEE});
          c.all_gather(send, recv);
          EXPECT_EQ(check_gathered(recv, 0, n, bytes), "") << "n=" << n << " bytes=" << bytes;
        });
      });
    }
  }
}

TEST(InProcess, InPlaceAllGather) {
  for (int n : {1, 2, 3, 5}) {
    run_ranks(n, [&](Communicator& c) {
      const std::size_t bytes = 24;
      EXPECT_EQ(check_gathered(all_gather_in_place(c, 1, bytes), 1, n, bytes), "");
    });
  }
}

TEST(InProcess, ManyRepeatedCollectives) {
  // Payload sizes and contents change every round; a reused slot, a late reader or a wrong
  // generation would show up as a wrong byte.
  for (int n : {2, 3, 4, 8}) {
    within(120s, [&] {
      run_ranks(n, [&](Communicator& c) {
        for (int round = 0; round < 500; ++round) {
          const std::size_t bytes = static_cast<std::size_t>((round * 37) % 257);
          auto send = payload(round, c.rank(), bytes);
          std::vector<std::byte> recv(bytes * n);
          c.all_gather(send, recv);
          const std::string err = check_gathered(recv, round, n, bytes);
          ASSERT_EQ(err, "") << "n=" << n;  // every rank fails the same way: no stranded rank
          if (round % 7 == 0) c.barrier();
        }
      });
    });
  }
}

TEST(InProcess, BarrierSeparatesPhases) {
  // No rank leaves barrier k before every rank has entered it.
  for (int n : {2, 4, 8}) {
    std::atomic<int> entered{0};
    std::atomic<bool> early{false};
    run_ranks(n, [&](Communicator& c) {
      for (int k = 1; k <= 50; ++k) {
        if (c.rank() == k % n) std::this_thread::sleep_for(200us);  // a late rank each time
        entered.fetch_add(1);
        c.barrier();
        if (entered.load() < k * n) early = true;
        c.barrier();  // keeps the next phase's increments away from this phase's check
      }
    });
    EXPECT_FALSE(early.load()) << "n=" << n;
  }
}

TEST(InProcess, GroupRunsSeveralTimes) {
  InProcessGroup group(3);
  for (int run = 0; run < 5; ++run) {
    group.run([&](Communicator& c) {
      auto send = payload(run, c.rank(), 5);
      std::vector<std::byte> recv(15);
      c.all_gather(send, recv);
      EXPECT_EQ(check_gathered(recv, run, 3, 5), "");
    });
  }
  EXPECT_FALSE(group.aborted());
}

TEST(InProcess, ExplicitThreadsWithComm) {
  InProcessGroup group(4);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(4);
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      Communicator& c = group.comm(r);
      auto send = payload(9, r, 11);
      std::vector<std::byte> recv(44);
      c.all_gather(send, recv);
      errors[r] = check_gathered(recv, 9, 4, 11);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) EXPECT_EQ(errors[r], "") << r;
  EXPECT_THROW(group.comm(4), ContractError);
  EXPECT_THROW(group.comm(-1), ContractError);
}

// ---------------------------------------------------------------------------------------------
// InProcessGroup: errors and no hangs

TEST(InProcess, InvalidSizes) {
  EXPECT_THROW(InProcessGroup(0), ContractError);
  EXPECT_THROW(InProcessGroup(-3), ContractError);
  EXPECT_THROW(InProcessGroup(2, InProcessOptions{-1ms}), ContractError);
}

TEST(InProcess, LocalSizeMismatchIsContractError) {
  // Every rank makes the same local mistake: each throws before entering the collective.
  std::atomic<int> contract_errors{0};
  EXPECT_THROW(run_ranks(3,
                         [&](Communicator& c) {
                           std::vector<std::byte> send(4), recv(4 * 3 - 1);
                           try {
                             c.all_gather(send, recv);
                           } catch (const ContractError&) {
                             contract_errors.fetch_add(1);
                             throw;
                           }
                         }),
               ContractError);
  EXPECT_EQ(contract_errors.load(), 3);
}

TEST(InProcess, CrossRankSizeMismatchEveryRankThrows) {
  std::atomic<int> contract_errors{0};
  std::vector<std::string> messages(3);
  within(30s, [&] {
    EXPECT_THROW(run_ranks(3,
                           [&](Communicator& c) {
                             const std::size_t bytes = c.rank() == 2 ? 8 : 4;
                             std::vector<std::byte> send(bytes), recv(bytes * 3);
                             try {
                               c.all_gather(send, recv);
                             } catch (const ContractError& e) {
                               messages[c.rank()] = e.what();
                               contract_errors.fetch_add(1);
                               throw;
                             }
                           }),
                 ContractError);
  });
  EXPECT_EQ(contract_errors.load(), 3);
  for (const auto& m : messages) {
    EXPECT_NE(m.find("size mismatch"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 2 sends 8"), std::string::npos) << m;
  }
}

TEST(InProcess, DifferentCollectivesEveryRankThrows) {
  std::atomic<int> contract_errors{0};
  within(30s, [&] {
    EXPECT_THROW(run_ranks(2,
                           [&](Communicator& c) {
                             try {
                               if (c.rank() == 0) {
                                 c.barrier();
                               } else {
                                 std::vector<std::byte> recv(0);
                                 c.all_gather({}, recv);
                               }
                             } catch (const ContractError& e) {
                               EXPECT_NE(std::string(e.what()).find("mismatch"), std::string::npos);
                               contract_errors.fetch_add(1);
                               throw;
                             }
                           }),
                 ContractError);
  });
  EXPECT_EQ(contract_errors.load(), 2);
}

TEST(InProcess, RankThrowingWakesWaitersQuickly) {
  for (int n : {2, 4, 8}) {
    for (int failing = 0; failing < n; failing += (n > 2 ? n - 1 : 1)) {
      std::atomic<int> woken{0};
      std::vector<std::string> messages(n);
      const auto start = std::chrono::steady_clock::now();
      within(30s, [&] {
        try {
          run_ranks(n, [&](Communicator& c) {
            // A few good collectives first, then one rank fails while the others wait.
            for (int round = 0; round < 3; ++round) {
              std::vector<std::byte> send = payload(round, c.rank(), 16), recv(16 * n);
              c.all_gather(send, recv);
            }
            if (c.rank() == failing) {
              std::this_thread::sleep_for(50ms);  // let the others block first
              throw std::invalid_argument("boom from the test");
            }
            std::vector<std::byte> send(16), recv(16 * n);
            try {
              c.all_gather(send, recv);
            } catch (const std::runtime_error& e) {
              messages[c.rank()] = e.what();
              woken.fetch_add(1);
              throw;
            }
          });
          ADD_FAILURE() << "run_ranks did not rethrow";
        } catch (const std::invalid_argument& e) {
          EXPECT_STREQ(e.what(), "boom from the test");  // the root cause, not a waiter's error
        }
      });
      const auto elapsed = std::chrono::steady_clock::now() - start;
      EXPECT_LT(elapsed, 5s);
      EXPECT_EQ(woken.load(), n - 1) << "n=" << n;
      const std::string expected = "in-process rank group aborted: rank " +
                                   std::to_string(failing) + " failed: boom from the test";
      for (int r = 0; r < n; ++r) {
        if (r != failing) {
          EXPECT_EQ(messages[r], expected) << "n=" << n << " rank " << r;
        }
      }
    }
  }
}

TEST(InProcess, RankThrowingBeforeOthersArrive) {
  // The failing rank aborts before the others even enter the collective.
  std::atomic<int> woken{0};
  within(30s, [&] {
    EXPECT_THROW(run_ranks(4,
                           [&](Communicator& c) {
                             if (c.rank() == 1) throw std::logic_error("early");
                             std::this_thread::sleep_for(50ms);
                             try {
                               c.barrier();
                             } catch (const std::runtime_error&) {
                               woken.fetch_add(1);
                               throw;
                             }
                           }),
                 std::logic_error);
  });
  EXPECT_EQ(woken.load(), 3);
}

TEST(InProcess, RankReturningEarlyDoesNotStrandOthers) {
  // Rank 0 does one collective fewer than the others and simply returns.
  for (bool others_first : {false, true}) {
    std::atomic<int> woken{0};
    within(30s, [&] {
      try {
        run_ranks(3, [&](Communicator& c) {
          c.barrier();
          if (c.rank() == 0) {
            if (!others_first) std::this_thread::sleep_for(50ms);
            return;
          }
          if (others_first) std::this_thread::sleep_for(50ms);
          try {
            c.barrier();
          } catch (const std::runtime_error& e) {
            EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
            woken.fetch_add(1);
            throw;
          }
        });
        ADD_FAILURE() << "run_ranks did not throw";
      } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("in-process rank group aborted"), std::string::npos)
            << e.what();
      }
    });
    EXPECT_EQ(woken.load(), 2) << "others_first=" << others_first;
  }
}

TEST(InProcess, CollectiveTimeout) {
  InProcessGroup group(3, InProcessOptions{500ms});
  std::vector<std::string> messages(3);
  std::atomic<int> woken{0};
  within(30s, [&] {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {  // rank 2 never comes
      threads.emplace_back([&, r] {
        try {
          group.comm(r).barrier();
        } catch (const std::runtime_error& e) {
          messages[r] = e.what();
          woken.fetch_add(1);
        }
      });
    }
    for (auto& t : threads) t.join();
  });
  EXPECT_EQ(woken.load(), 2);
  EXPECT_TRUE(group.aborted());
  for (int r = 0; r < 2; ++r) {
    // Normally "waiting for rank 2"; on a very loaded machine rank 0 or 1 may also be late.
    EXPECT_NE(messages[r].find("timed out after 500 ms in barrier waiting for "), std::string::npos)
        << messages[r];
    EXPECT_EQ(messages[r].back(), '2') << messages[r];
  }
  // An aborted group stays aborted.
  EXPECT_THROW(group.comm(2).barrier(), std::runtime_error);
  EXPECT_THROW(group.run([](Communicator&) {}), ContractError);
}

TEST(InProcess, ExplicitAbortWakesWaiters) {
  InProcessGroup group(3);
  std::atomic<int> woken{0};
  within(30s, [&] {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        std::vector<std::byte> send(4), recv(12);
        try {
          group.comm(r).all_gather(send, recv);
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "in-process rank group aborted: rank 2 failed: gone");
          woken.fetch_add(1);
        }
      });
    }
    std::this_thread::sleep_for(50ms);
    group.abort(2, "gone");
    group.abort(1, "second reason is ignored");
    for (auto& t : threads) t.join();
  });
  EXPECT_EQ(woken.load(), 2);
}

TEST(InProcess, SameRankFromTwoThreadsIsContractError) {
  InProcessGroup group(2, InProcessOptions{2000ms});
  std::atomic<int> contract_errors{0};
  within(30s, [&] {
    // Two threads both play rank 0; rank 1 never comes, so the first one waits (until the
    // timeout) and the second must be refused immediately.
    // (Whichever thread comes second gets the ContractError; the sleep makes it this one.)
    auto play_rank0 = [&] {
      try {
        group.comm(0).barrier();
      } catch (const ContractError&) {
        contract_errors.fetch_add(1);
      } catch (const std::runtime_error&) {
      }
    };
    std::thread first(play_rank0);
    std::this_thread::sleep_for(100ms);
    play_rank0();
    group.abort(1, "test over");
    first.join();
  });
  EXPECT_EQ(contract_errors.load(), 1);
}

// ---------------------------------------------------------------------------------------------
// Rank map

TEST(RankMap, MegatronLayouts) {
  // The usual Megatron order: tp_rank = r % tp, cp_rank = r / tp, TP group contiguous.
  struct Case {
    int tp, cp;
  };
  for (Case k : {Case{1, 1}, Case{1, 2}, Case{2, 1}, Case{2, 2}, Case{4, 1}, Case{4, 2}}) {
    const int world = k.tp * k.cp;
    for (int r = 0; r < world; ++r) {
      RankPlacement p = place_rank(r, world, k.tp, k.cp);
      EXPECT_EQ(p.tp, k.tp);
      EXPECT_EQ(p.cp, k.cp);
      EXPECT_EQ(p.dp, 1);
      EXPECT_EQ(p.tp_rank, r % k.tp);
      EXPECT_EQ(p.cp_rank, r / k.tp);
      EXPECT_EQ(p.dp_rank, 0);
      EXPECT_EQ(p.tp_group_first, p.cp_rank * k.tp);
      EXPECT_EQ(p.cp_group_first, p.tp_rank);
    }
  }
}

TEST(RankMap, DataParallelOutermost) {
  // tp=2, cp=2, world 8: dp = 2.
  for (int r = 0; r < 8; ++r) {
    RankPlacement p = place_rank(r, 8, 2, 2);
    EXPECT_EQ(p.dp, 2);
    EXPECT_EQ(p.tp_rank, r % 2);
    EXPECT_EQ(p.cp_rank, (r / 2) % 2);
    EXPECT_EQ(p.dp_rank, r / 4);
    EXPECT_EQ(p.tp_group_first, r - r % 2);
    EXPECT_EQ(p.cp_group_first, (r / 4) * 4 + r % 2);
  }
}

TEST(RankMap, Errors) {
  try {
    place_rank(0, 3, 2, 1);
    FAIL() << "no throw";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("does not match TP*CP"), std::string::npos);
  }
  EXPECT_THROW(place_rank(0, 2, 4, 1), ContractError);  // world smaller than tp*cp
  EXPECT_THROW(place_rank(0, 6, 2, 2), ContractError);
  EXPECT_THROW(place_rank(0, 4, 0, 1), ContractError);
  EXPECT_THROW(place_rank(0, 4, 2, -1), ContractError);
  EXPECT_THROW(place_rank(4, 4, 2, 2), ContractError);
  EXPECT_THROW(place_rank(-1, 4, 2, 2), ContractError);
}

}  // namespace
}  // namespace detlogp
