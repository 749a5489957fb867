# Latent attention at depth microbenchmark (included from bench/CMakeLists.txt).
add_executable(latent_attention_bench ${CMAKE_CURRENT_LIST_DIR}/latent_attention_bench.cpp)
target_link_libraries(latent_attention_bench PRIVATE kestrel_kernels OpenMP::OpenMP_CXX)
