# Linear-kernel microbenchmark (included from bench/CMakeLists.txt).
add_executable(linear_bench ${CMAKE_CURRENT_LIST_DIR}/linear_bench.cpp)
target_link_libraries(linear_bench PRIVATE kestrel_kernels OpenMP::OpenMP_CXX)
