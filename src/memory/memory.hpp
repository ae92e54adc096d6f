#pragma once
// How much memory this process may still allocate, and up-front refusals of work that would not
// fit (instead of a bare std::bad_alloc, or the kernel's OOM killer, halfway through).
//
// Available = the smallest headroom of: the cgroup limits of this process's cgroup and its
// ancestors (cgroup v2 memory.max - memory.current; v1 memory.limit_in_bytes -
// memory.usage_in_bytes), and /proc/meminfo's MemAvailable.
//
// Testing hook: DETLOGP_TESTING_MEMORY_LIMIT=<bytes> replaces all of that with <bytes> (so that
// tests can check the refusals without a writable cgroup).
//
// Its own library (detlogp_memory), so that the Python extension applies the same rule to the
// drift report's up-front check (python/src/memory_bindings.cpp).

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace detlogp::io {

struct AvailableMemory {
  std::uint64_t bytes = 0;
  bool known = false;  // false: nothing could be read (then nothing is refused)
  std::string source;  // e.g. "cgroup v2 memory.max of /sys/fs/cgroup/a/b", "MemAvailable"
};

AvailableMemory available_memory();

// Throws std::runtime_error unless `needed` bytes fit in available_memory():
// "<what> needs N bytes (X GB) but this process has M bytes (Y GB) available (<source>); <fix>".
void require_memory(std::uint64_t needed, std::string_view what, std::string_view fix);

// The product of `factors` (sizes, counts, an item size), or ContractError "<what> overflows
// 64-bit sizes" naming the factors.
std::uint64_t checked_product(std::initializer_list<std::uint64_t> factors, std::string_view what);
std::uint64_t checked_product(std::span<const std::uint64_t> factors, std::string_view what);

// "12.3 GB" (decimal units) of a byte count.
std::string format_bytes(std::uint64_t bytes);

// A zero-filled buffer of n bytes; a failed allocation becomes std::runtime_error
// "<step>: cannot allocate N bytes (X GB): out of memory".
std::vector<std::byte> allocate_bytes(std::size_t n, std::string_view step);

}  // namespace detlogp::io
