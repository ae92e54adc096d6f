#pragma once
// The clock of the benchmarks that time one thread's work: CPU seconds of the calling thread,
// which the other processes of a loaded machine do not inflate the way they inflate wall time.

#include <time.h>

inline double thread_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
