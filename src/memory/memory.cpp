#include "memory/memory.hpp"

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "detlogp/errors.hpp"

namespace detlogp::io {
namespace {

constexpr std::string_view kCgroupRoot = "/sys/fs/cgroup";

// The first line of a small kernel file, or empty.
std::string read_first_line(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

std::optional<std::uint64_t> parse_u64(std::string_view text) {
  if (text.empty()) return std::nullopt;
  std::uint64_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto digit = static_cast<std::uint64_t>(c - '0');
    if (value > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

void take_min(AvailableMemory& best, std::uint64_t bytes, std::string source) {
  if (!best.known || bytes < best.bytes) {
    best.bytes = bytes;
    best.known = true;
    best.source = std::move(source);
  }
}

// The headroom under `limit_file` (a number, or "max": none) given the usage in `usage_file`.
void cgroup_level(AvailableMemory& best, const std::filesystem::path& dir, const char* limit_file,
                  const char* usage_file, std::string_view version) {
  const auto limit = parse_u64(read_first_line(dir / limit_file));
  // v1 writes "no limit" as a huge number near 2^63.
  if (!limit || *limit >= (std::uint64_t{1} << 60)) return;
  const std::uint64_t usage = parse_u64(read_first_line(dir / usage_file)).value_or(0);
  take_min(best, usage >= *limit ? 0 : *limit - usage,
           fmt::format("cgroup {} {} {} of {}", version, limit_file, *limit, dir.string()));
}

void cgroup_limits(AvailableMemory& best) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    // "0::/path" (v2) or "N:memory:/path" or "N:cpu,memory:/path" (v1).
    const auto first = line.find(':');
    const auto second = first == line.npos ? line.npos : line.find(':', first + 1);
    if (second == line.npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::filesystem::path rel =
        std::filesystem::path(line.substr(second + 1)).relative_path();
    const bool v2 = controllers.empty();
    bool memory = v2;
    std::stringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');) memory = memory || c == "memory";
    if (!memory) continue;
    // v2: /sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid (v1 + v2) host.
    std::filesystem::path base = std::filesystem::path(kCgroupRoot) / "memory";
    if (v2) {
      base = std::filesystem::path(kCgroupRoot);
      std::error_code ec;
      if (!std::filesystem::exists(base / "cgroup.controllers", ec)) base /= "unified";
    }
    // This cgroup and every ancestor: a parent's limit binds its children.
    for (std::filesystem::path dir = base / rel;; dir = dir.parent_path()) {
      if (v2) {
        cgroup_level(best, dir, "memory.max", "memory.current", "v2");
      } else {
        cgroup_level(best, dir, "memory.limit_in_bytes", "memory.usage_in_bytes", "v1");
      }
      if (dir == base || !dir.has_relative_path() || dir.string().size() <= base.string().size()) {
        break;
      }
    }
  }
}

void meminfo(AvailableMemory& best) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") {
      take_min(best, kib * 1024, "MemAvailable of /proc/meminfo");
      return;
    }
  }
}

}  // namespace

AvailableMemory available_memory() {
  AvailableMemory best;
  if (const char* hook = std::getenv("DETLOGP_TESTING_MEMORY_LIMIT")) {
    if (const auto bytes = parse_u64(hook)) {
      take_min(best, *bytes, "DETLOGP_TESTING_MEMORY_LIMIT");
      return best;
    }
  }
  cgroup_limits(best);
  meminfo(best);
  return best;
}

std::uint64_t checked_product(std::span<const std::uint64_t> factors, std::string_view what) {
  std::uint64_t out = 1;
  for (const std::uint64_t f : factors) {
    if (__builtin_mul_overflow(out, f, &out)) {
      std::string text;
      for (const std::uint64_t g : factors) text += (text.empty() ? "" : " x ") + std::to_string(g);
      throw ContractError(fmt::format("{} overflows 64-bit sizes ({})", what, text));
    }
  }
  return out;
}

std::uint64_t checked_product(std::initializer_list<std::uint64_t> factors, std::string_view what) {
  return checked_product(std::span<const std::uint64_t>(factors.begin(), factors.size()), what);
}

std::string format_bytes(std::uint64_t bytes) {
  if (bytes < 1'000'000) return fmt::format("{} bytes", bytes);
  return fmt::format("{} bytes ({:.1f} GB)", bytes, static_cast<double>(bytes) / 1e9);
}

void require_memory(std::uint64_t needed, std::string_view what, std::string_view fix) {
  const AvailableMemory available = available_memory();
  if (!available.known || needed <= available.bytes) return;
  throw std::runtime_error(fmt::format("{} needs {} but this process has {} available ({}); {}",
                                       what, format_bytes(needed), format_bytes(available.bytes),
                                       available.source, fix));
}

std::vector<std::byte> allocate_bytes(std::size_t n, std::string_view step) {
  try {
    return std::vector<std::byte>(n);
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
  throw std::runtime_error(
      fmt::format("{}: cannot allocate {}: out of memory", step, format_bytes(n)));
}

}  // namespace detlogp::io
