# Int8-activation GEMV/GEMM microbenchmark (google-benchmark; skipped when it is not installed).
if(benchmark_FOUND)
  add_executable(w4a8_bench ${CMAKE_CURRENT_LIST_DIR}/w4a8_bench.cpp)
  target_link_libraries(w4a8_bench PRIVATE kestrel_kernels benchmark::benchmark OpenMP::OpenMP_CXX)
endif()
