#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kestrel::media::test {

std::vector<uint8_t> read_fixture(const std::string& name);
std::string sha256_hex(const void* data, size_t n);

}  // namespace kestrel::media::test
