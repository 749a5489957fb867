# Vision encoder benchmark over a model directory (included from bench/CMakeLists.txt).
add_executable(vision_bench ${CMAKE_CURRENT_LIST_DIR}/vision_bench.cpp)
target_link_libraries(vision_bench PRIVATE kestrel_runtime kestrel_loader OpenMP::OpenMP_CXX)
