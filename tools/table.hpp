#pragma once
// Plain-text tables for the commands' readable reports: a header row, a rule, and columns
// padded to their widest cell (numbers right-aligned, text left-aligned).

#include <string>
#include <vector>

namespace detlogp::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> header);
  void add_row(std::vector<std::string> cells);
  std::string str() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// Number formatting shared by the reports.
std::string fmt_seconds(double s);     // "0.412 s", "12.3 ms"
std::string fmt_rate(double per_sec);  // "3.79e+08/s"
std::string fmt_error(double e);       // "1.9e-06", "0"

}  // namespace detlogp::cli
