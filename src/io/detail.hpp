#pragma once
// Internal helpers of the io layer: one-line error messages that name the file, and safe
// rendering of untrusted strings (tensor names, dtypes, parser messages) inside them.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace detlogp::io::detail {

// Throws ContractError("<label>: <message>"), with any control or non-ASCII byte escaped so the
// message stays on one line.
[[noreturn]] void fail(std::string_view label, std::string_view message);

// `text` with bytes outside printable ASCII written as \xNN, cut to `max_chars` (then "...").
std::string printable(std::string_view text, std::size_t max_chars = 80);
// printable(text) in single quotes.
std::string in_quotes(std::string_view text);
// "tensor 'name'": how a message names a tensor of a file.
std::string tensor_named(std::string_view name);
// "'a', 'b', 'c'" (at most `max_names`, then "and N more").
std::string in_quotes_list(const std::vector<std::string>& names, std::size_t max_names = 10);

}  // namespace detlogp::io::detail
