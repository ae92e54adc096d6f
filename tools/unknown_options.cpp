#include "unknown_options.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstddef>

namespace detlogp::cli {
namespace {

// Optimal string alignment distance: insertions, deletions, substitutions and transpositions
// of neighbours, each one edit.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

std::string_view strip_dashes(std::string_view s) {
  while (!s.empty() && s.front() == '-') s.remove_prefix(1);
  return s;
}

// An argument that reads as an option: "--name", "--name=value" or "-x" (not a number).
bool looks_like_option(const std::string& arg) {
  if (arg.size() < 2 || arg[0] != '-') return false;
  if (arg[1] == '-') return arg.size() > 2;
  return !(arg[1] >= '0' && arg[1] <= '9') && arg[1] != '.';
}

// Every name of every option of `app` ("--tokens", "-h").
std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : app.get_options()) {
    for (const std::string& n : opt->get_lnames()) names.push_back("--" + n);
    for (const std::string& n : opt->get_snames()) names.push_back("-" + n);
  }
  return names;
}

void collect(const CLI::App& app, std::vector<std::string>& out) {
  const std::vector<std::string> known = option_names(app);
  for (const std::string& arg : app.remaining(false)) {
    if (!looks_like_option(arg)) continue;
    const std::string name = arg.substr(0, arg.find('='));
    std::string item = "unknown option " + name;
    const std::vector<std::string> meant = likely_meant(name, known);
    if (meant.size() == 1) {
      item += " (did you mean " + meant[0] + "?)";
    } else if (!meant.empty()) {
      item += " (did you mean one of ";
      for (std::size_t k = 0; k < meant.size(); ++k) item += (k ? ", " : "") + meant[k];
      item += "?)";
    }
    out.push_back(item);
  }
  for (const CLI::App* sub : app.get_subcommands()) collect(*sub, out);
}

}  // namespace

std::vector<std::string> likely_meant(std::string_view typed,
                                      const std::vector<std::string>& known) {
  const std::string_view t = strip_dashes(typed);
  if (t.empty()) return {};
  const std::size_t limit = std::clamp<std::size_t>(t.size() / 3, 1, 2);
  std::vector<std::string> nearest;
  std::size_t best = limit + 1;
  for (const std::string& k : known) {
    const std::size_t d = edit_distance(t, strip_dashes(k));
    if (d > limit) continue;
    if (d < best) {
      best = d;
      nearest.clear();
    }
    if (d == best) nearest.push_back(k);
  }
  if (!nearest.empty()) return nearest;
  std::vector<std::string> extended;
  for (const std::string& k : known) {
    if (strip_dashes(k).starts_with(t)) extended.push_back(k);
  }
  return extended;
}

std::string unknown_options_message(const CLI::App& app) {
  std::vector<std::string> items;
  collect(app, items);
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : "; ") + item;
  return out;
}

}  // namespace detlogp::cli
