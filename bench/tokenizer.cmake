# Tokenizer encode benchmark (plain executable; compare with tiktoken via tools/tokenizer_bench.py).
add_executable(tokenizer_bench ${PROJECT_SOURCE_DIR}/bench/tokenizer_bench.cpp)
target_link_libraries(tokenizer_bench PRIVATE kestrel_chat)
