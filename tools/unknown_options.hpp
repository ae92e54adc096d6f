#pragma once
// Options nobody asked for: after a failed parse, the options on the command line that the
// command does not have (a typo such as --logit), each with the options it may have meant.
// Reported before anything else CLI11 found, since a typo is usually why a required option is
// "missing".

#include <string>
#include <string_view>
#include <vector>

namespace CLI {
class App;
}

namespace detlogp::cli {

// "unknown option --logit (did you mean --logits?)", several joined with "; ", or "" when the
// parse left no unknown option behind. `app`: the top-level app after parse() (its parsed
// subcommand included).
std::string unknown_options_message(const CLI::App& app);

// The names in `known` (e.g. "--tokens") that `typed` most likely meant: the nearest ones by
// edit distance (a transposition counts one) when at most 1 edit per 3 letters (and at most 2)
// away, else every name `typed` is a prefix of; empty when none.
std::vector<std::string> likely_meant(std::string_view typed,
                                      const std::vector<std::string>& known);

}  // namespace detlogp::cli
