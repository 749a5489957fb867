# Shared compile flags and the one-library-per-folder helper.
add_library(kestrel_flags INTERFACE)
target_compile_options(kestrel_flags INTERFACE -Wall -Wextra -Werror -Wno-unknown-pragmas)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # GCC 12 reports false -Wrestrict positives inside libstdc++ string concatenation (GCC PR105651).
  target_compile_options(kestrel_flags INTERFACE -Wno-restrict)
endif()
# 64-byte vector-extension types (v16 floats) are passed between inline helpers of one file; on a CPU
# without AVX-512, GCC and clang warn that their ABI differs from an AVX-512 build. No such value crosses a
# library boundary, so the note does not apply; without this, -march=native fails on AVX2-only CPUs.
target_compile_options(kestrel_flags INTERFACE -Wno-psabi)
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  # `#pragma omp simd` is a hint; clang at -O1 (fuzz/sanitizer builds) reports loops it did not vectorise.
  target_compile_options(kestrel_flags INTERFACE -Wno-pass-failed)
endif()
if(KESTREL_NATIVE)
  target_compile_options(kestrel_flags INTERFACE -march=native)
endif()
# Let `a += b * c` become one FMA (GCC's default under -std=c++20 is off). One rounding instead of two;
# every path computes the same expressions, so results stay identical across batch sizes.
target_compile_options(kestrel_flags INTERFACE -ffp-contract=fast)
if(KESTREL_SANITIZE)
  target_compile_options(kestrel_flags INTERFACE -fsanitize=address,undefined -fno-omit-frame-pointer
                                                 -fno-sanitize-recover=undefined)
  target_link_options(kestrel_flags INTERFACE -fsanitize=address,undefined)
endif()
if(KESTREL_FUZZ)
  target_compile_options(kestrel_flags INTERFACE -fsanitize=fuzzer-no-link)
endif()

# kestrel_library(<name> SOURCES <files...> DEPS <targets...>)
# Creates target kestrel_<name>; dependencies must point down the tree (docs/architecture.md §1).
function(kestrel_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(kestrel_${name} STATIC ${ARG_SOURCES})
  target_include_directories(kestrel_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(kestrel_${name} PUBLIC kestrel_flags ${ARG_DEPS})
endfunction()
