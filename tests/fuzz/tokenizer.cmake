# libFuzzer target for the tokenizer (vocabulary parser, encode/decode, stream decoder). Clang only.
if(KESTREL_FUZZ)
  add_executable(fuzz_tokenizer ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_tokenizer.cpp)
  target_link_libraries(fuzz_tokenizer PRIVATE kestrel_chat)
  target_link_options(fuzz_tokenizer PRIVATE -fsanitize=fuzzer)
endif()
