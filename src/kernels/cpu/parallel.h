// Loops that run in an OpenMP parallel region only when the work is worth it.
// Why not `#pragma omp parallel for if (cond)`: a region whose if() is false still enters libgomp,
// which builds a one-thread team for it, and libgomp caches only teams of more than one thread, so
// every such region mallocs and frees its team: a heap allocation per layer per decoded token.
// parallel_for skips the region entirely when the loop runs serially (also with one OpenMP thread).
#pragma once

#include <omp.h>

#include <cstdint>

namespace kestrel::kernels {

// body(i) for i = begin, begin + step, ... < end; statically scheduled across threads when `parallel`
// holds, there is more than one iteration and more than one thread. Same per-iteration work either way.
template <class F>
inline void parallel_for(int64_t begin, int64_t end, int64_t step, bool parallel, F&& body) {
  if (parallel && end - begin > step && omp_get_max_threads() > 1) {
#pragma omp parallel for schedule(static)
    for (int64_t i = begin; i < end; i += step) body(i);
  } else {
    for (int64_t i = begin; i < end; i += step) body(i);
  }
}

// body(i) for i in [0, n), dynamically scheduled in chunks of `chunk` when there is more than one thread.
template <class F>
inline void parallel_for_dynamic(int64_t n, int64_t chunk, F&& body) {
  if (n > 1 && omp_get_max_threads() > 1) {
#pragma omp parallel for schedule(dynamic, chunk)
    for (int64_t i = 0; i < n; ++i) body(i);
  } else {
    for (int64_t i = 0; i < n; ++i) body(i);
  }
}

// The same, with enter() run once by every thread of the region before it takes work (also once inline when
// the loop runs serially): per-thread set-up that must not depend on which items a thread happens to get.
template <class E, class F>
inline void parallel_for_dynamic(int64_t n, int64_t chunk, E&& enter, F&& body) {
  if (n > 1 && omp_get_max_threads() > 1) {
#pragma omp parallel
    {
      enter();
#pragma omp for schedule(dynamic, chunk)
      for (int64_t i = 0; i < n; ++i) body(i);
    }
  } else {
    if (n > 0) enter();
    for (int64_t i = 0; i < n; ++i) body(i);
  }
}

// True when a parallel region is worth entering: more than one OpenMP thread. Regions that need per-thread
// set-up test this and run their loop inline otherwise (a one-thread region costs a heap allocation).
inline bool threads_available() { return omp_get_max_threads() > 1; }

}  // namespace kestrel::kernels
