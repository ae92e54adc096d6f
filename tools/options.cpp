// The option helpers every command shares (declared in cli.hpp): thread counts, the collective
// timeout, the in-process TP limit, integer lists.

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "cli.hpp"

namespace detlogp::cli {

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

int rank_threads(int total, int ranks, int rank) {
  return std::max(1, total / ranks + (rank < total % ranks ? 1 : 0));
}

void check_softcap_option(const std::optional<float>& softcap) {
  if (softcap && !(std::isfinite(*softcap) && *softcap > 0)) {
    throw UsageError(fmt::format("--softcap must be finite and > 0; got {}", *softcap));
  }
}

std::chrono::milliseconds parse_collective_timeout(double seconds) {
  if (!(std::isfinite(seconds) && seconds >= 0 && seconds <= 1e9)) {
    throw UsageError(fmt::format(
        "--collective-timeout must be a number of seconds in [0, 1e9] (0: no limit); got {}",
        seconds));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

void check_in_process_tp(int64_t tp, const char* option) {
  if (tp < 1 || tp > kMaxInProcessRanks) {
    throw UsageError(fmt::format(
        "{} {} must be in [1, {}]: the in-process group runs every TP rank as a thread of this "
        "process and the memory of its collectives grows with the square of the degree (use "
        "--comm mpi for more ranks)",
        option, tp, kMaxInProcessRanks));
  }
}

std::vector<int64_t> parse_int_list(const std::string& text, const std::string& option) {
  std::vector<int64_t> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || v <= 0) {
      throw UsageError(fmt::format(
          "{} must be a comma-separated list of positive integers; got '{}'", option, text));
    }
    out.push_back(v);
    pos = comma + 1;
  }
  return out;
}

}  // namespace detlogp::cli
