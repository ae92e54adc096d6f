#pragma once
// Runs fn(item) for item in [0, items) on up to `threads` threads (the caller's among them),
// items taken in any order. Every item writes only its own outputs, so the bits never depend
// on the thread count or the schedule. A thread that cannot be started runs nothing (the others
// take its items); the first exception is rethrown after every thread has stopped. Used by the
// fused lm_head's CPU kernels and the candidate scan (top_candidates).

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace detlogp::kernels {

inline int resolve_threads(int requested, int64_t items) {
  int64_t t = requested > 0 ? requested : static_cast<int64_t>(std::thread::hardware_concurrency());
  t = std::clamp<int64_t>(t, 1, 256);
  return static_cast<int>(std::max<int64_t>(1, std::min(t, items)));
}

// fn(item, worker): worker in [0, threads) names per-thread scratch.
template <class Fn>
void run_items(int64_t items, int threads, const Fn& fn) {
  if (items <= 0) return;
  if (threads <= 1) {
    for (int64_t i = 0; i < items; ++i) fn(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&](int worker) {
    try {
      for (int64_t i = next++; i < items && !failed; i = next++) fn(i, worker);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      failed = true;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) {
    try {
      pool.emplace_back(work, t);
    } catch (const std::system_error&) {
      break;  // fewer threads: same items, same bits
    }
  }
  work(0);
  for (std::thread& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace detlogp::kernels
