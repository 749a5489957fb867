# KDA core microbenchmark (included from bench/CMakeLists.txt).
add_executable(kda_bench ${CMAKE_CURRENT_LIST_DIR}/kda_bench.cpp)
target_link_libraries(kda_bench PRIVATE kestrel_kernels OpenMP::OpenMP_CXX)
