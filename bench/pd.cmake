# P->D transfer throughput against the link's own limit, two processes over UCX (included from bench/CMakeLists.txt).
add_executable(pd_transfer_bench ${CMAKE_CURRENT_LIST_DIR}/pd_transfer_bench.cpp)
target_link_libraries(pd_transfer_bench PRIVATE kestrel_pd kestrel_models)
