# Restore bandwidth of the prefix cache's lower tiers (included from bench/CMakeLists.txt).
add_executable(tier_restore_bench ${CMAKE_CURRENT_LIST_DIR}/tier_restore_bench.cpp)
target_link_libraries(tier_restore_bench PRIVATE kestrel_cache_tiers kestrel_cache_redis)
