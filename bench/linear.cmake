# Linear kernel microbenchmark, every weight format (included from bench/CMakeLists.txt).
add_executable(linear_bench ${CMAKE_CURRENT_LIST_DIR}/linear_bench.cpp)
target_link_libraries(linear_bench PRIVATE kestrel_kernels)
