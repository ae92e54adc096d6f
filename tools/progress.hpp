#pragma once
// The progress line on stderr: "\r[tp 2] forward..." rewritten in place on a terminal, one line
// per step otherwise (logs stay readable). Silent when disabled (MPI ranks other than 0).

#include <string>

namespace detlogp::cli {

class Progress {
 public:
  explicit Progress(bool enabled);
  ~Progress();  // clears the line
  void step(const std::string& text);
  void clear();

 private:
  bool enabled_;
  bool tty_;
  std::size_t last_width_ = 0;
};

}  // namespace detlogp::cli
