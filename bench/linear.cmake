# Linear kernel microbenchmark, every weight format (included from bench/CMakeLists.txt).
add_executable(linear_bench ${CMAKE_CURRENT_LIST_DIR}/linear_bench.cpp)
target_link_libraries(linear_bench PRIVATE kestrel_kernels)
# Per-shape GEMV/GEMM with wall and CPU time (bf16 / f16 / f32 / MXFP4, T list).
add_executable(gemm_bench ${CMAKE_CURRENT_LIST_DIR}/gemm_bench.cpp)
target_link_libraries(gemm_bench PRIVATE kestrel_kernels OpenMP::OpenMP_CXX)
# DRAM read bandwidth (the decode roofline).
add_executable(membw_bench ${CMAKE_CURRENT_LIST_DIR}/membw_bench.cpp)
target_link_libraries(membw_bench PRIVATE OpenMP::OpenMP_CXX)
