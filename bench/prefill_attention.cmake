# Prefill attention microbenchmark (included from bench/CMakeLists.txt).
add_executable(prefill_attention_bench ${CMAKE_CURRENT_LIST_DIR}/prefill_attention_bench.cpp)
target_link_libraries(prefill_attention_bench PRIVATE kestrel_kernels OpenMP::OpenMP_CXX)
