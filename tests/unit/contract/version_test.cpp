#include <gtest/gtest.h>

#include "detlogp/version.hpp"

TEST(Version, LibraryVersionIsSemantic) {
  const std::string_view v = detlogp::version();
  int dots = 0;
  for (char c : v) dots += (c == '.');
  EXPECT_EQ(dots, 2) << v;
  EXPECT_FALSE(detlogp::kNumericsVersion.empty());
}
