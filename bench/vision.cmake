# Vision encoder benchmark over a model directory (included from bench/CMakeLists.txt).
add_executable(vision_bench ${CMAKE_CURRENT_LIST_DIR}/vision_bench.cpp)
target_link_libraries(vision_bench PRIVATE kestrel_runtime kestrel_loader nlohmann_json::nlohmann_json OpenMP::OpenMP_CXX)
# Image decode + preprocessing per file (bench/preprocess_vs_pillow.py compares it with Pillow).
add_executable(preprocess_bench ${CMAKE_CURRENT_LIST_DIR}/preprocess_bench.cpp)
target_link_libraries(preprocess_bench PRIVATE kestrel_media nlohmann_json::nlohmann_json)
