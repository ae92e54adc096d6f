#pragma once
// parallel_for over [0, n) in contiguous chunks, one std::thread per chunk (the calling thread
// takes the first). For the tool's own loops (data generation, the naive benchmark kernel, the
// bandwidth probe); the library's kernels have their own threading.

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace detlogp::cli {

template <class Fn>
void parallel_for(int64_t n, int threads, Fn&& fn) {
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(threads, n));
  if (chunks == 1) {
    if (n > 0) fn(int64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(chunks));
  auto bounds = [&](int64_t k) { return n * k / chunks; };
  for (int64_t k = 1; k < chunks; ++k) {
    pool.emplace_back([&, k] {
      try {
        fn(bounds(k), bounds(k + 1));
      } catch (...) {
        errors[static_cast<std::size_t>(k)] = std::current_exception();
      }
    });
  }
  try {
    fn(bounds(0), bounds(1));
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& t : pool) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace detlogp::cli
