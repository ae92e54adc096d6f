#include "rank_agreement.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <string_view>

#include <fmt/format.h>

namespace detlogp::cli {
namespace {

// A NUL-padded text of at most N - 1 bytes (a longer one is cut): records of one fixed size
// are what an all-gather moves.
template <std::size_t N>
struct FixedText {
  std::array<char, N> bytes{};

  explicit FixedText(std::string_view text = {}) {
    std::copy_n(text.data(), std::min(text.size(), N - 1), bytes.data());
  }
  std::string str() const { return std::string(bytes.data(), strnlen(bytes.data(), N)); }
};

// One rank's contribution: its preflight verdict and its options.
struct AgreementRecord {
  char ok = 1;
  FixedText<1024> error;
  FixedText<1024> options;
};

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t nl = std::min(text.find('\n', pos), text.size());
    out.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

}  // namespace

std::string agree_on_options(Communicator& world, const std::function<void()>& preflight,
                             const std::vector<std::string>& options) {
  AgreementRecord mine;
  try {
    preflight();
  } catch (const std::exception& e) {
    mine.ok = 0;
    mine.error = FixedText<1024>(e.what());
  }
  std::string joined;
  for (const std::string& item : options) joined += item + "\n";
  mine.options = FixedText<1024>(joined);
  std::vector<AgreementRecord> all(static_cast<std::size_t>(world.size()));
  all_gather(world, std::span<const AgreementRecord>(&mine, 1), std::span<AgreementRecord>(all));
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (!all[r].ok) {
      // Usually every rank fails alike and rank 0 says so in its own words.
      return r == 0 ? all[r].error.str() : fmt::format("rank {}: {}", r, all[r].error.str());
    }
  }
  const std::vector<std::string> first = split_lines(all[0].options.str());
  for (std::size_t r = 1; r < all.size(); ++r) {
    const std::vector<std::string> other = split_lines(all[r].options.str());
    for (std::size_t k = 0; k < std::min(first.size(), other.size()); ++k) {
      if (first[k] != other[k]) {
        return fmt::format(
            "the processes disagree on their options: rank 0 has {} but rank {} has {}; launch "
            "every process with the same options",
            first[k], r, other[k]);
      }
    }
  }
  return {};
}

}  // namespace detlogp::cli
