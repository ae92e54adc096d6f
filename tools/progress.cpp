#include "progress.hpp"

#include <unistd.h>

#include <cstdio>

namespace detlogp::cli {

Progress::Progress(bool enabled) : enabled_(enabled), tty_(isatty(STDERR_FILENO) == 1) {}

Progress::~Progress() { clear(); }

void Progress::step(const std::string& text) {
  if (!enabled_) return;
  if (tty_) {
    std::string pad(last_width_ > text.size() ? last_width_ - text.size() : 0, ' ');
    std::fprintf(stderr, "\r%s%s", text.c_str(), pad.c_str());
    last_width_ = text.size();
  } else {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
  std::fflush(stderr);
}

void Progress::clear() {
  if (!enabled_ || !tty_ || last_width_ == 0) return;
  std::fprintf(stderr, "\r%s\r", std::string(last_width_, ' ').c_str());
  std::fflush(stderr);
  last_width_ = 0;
}

}  // namespace detlogp::cli
