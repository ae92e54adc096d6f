// detlogp command line. Until the CLI issue lands this only reports its versions.
#include <cstring>
#include <iostream>

#include "detlogp/detlogp.hpp"

int main(int argc, char** argv) {
  if (argc >= 2 && (std::strcmp(argv[1], "--version") == 0 || std::strcmp(argv[1], "version") == 0)) {
    std::cout << "detlogp " << detlogp::version() << " (numerics " << detlogp::kNumericsVersion
              << ")\n";
    return 0;
  }
  std::cerr << "usage: detlogp --version\n";
  return 2;
}
