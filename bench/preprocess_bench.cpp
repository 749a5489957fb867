// Image decode + preprocessing benchmark: for each file, the best and all times of `media::decode_image` and of
// `media::preprocess_image` (the Kimi K3 reference processor, default config) over REPS runs, one JSON object per
// file on stdout. bench/preprocess_vs_pillow.py runs it next to Pillow's reference preprocessing on the same files.
//
//   preprocess_bench REPS FILE...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "media/image_decode.h"
#include "media/preprocess.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: preprocess_bench REPS FILE...\n");
    return 2;
  }
  const int reps = std::max(1, std::atoi(argv[1]));
  for (int a = 2; a < argc; ++a) {
    std::ifstream in(argv[a], std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<double> decode_ms, preprocess_ms;
    nlohmann::json row = {{"file", std::string(argv[a])}, {"bytes", bytes.size()}};
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      auto decoded = kestrel::media::decode_image(bytes);
      const auto t1 = std::chrono::steady_clock::now();
      if (!decoded) {
        std::fprintf(stderr, "preprocess_bench: %s: %s\n", argv[a], decoded.error().message().c_str());
        return 1;
      }
      auto pre = kestrel::media::preprocess_image(*decoded);
      const auto t2 = std::chrono::steady_clock::now();
      if (!pre) {
        std::fprintf(stderr, "preprocess_bench: %s: %s\n", argv[a], pre.error().message().c_str());
        return 1;
      }
      decode_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      preprocess_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
      row["width"] = decoded->width, row["height"] = decoded->height;
      row["resized"] = {pre->plan.new_width, pre->plan.new_height};
      row["patches"] = pre->num_patches();
    }
    row["decode_ms"] = decode_ms, row["preprocess_ms"] = preprocess_ms;
    std::printf("%s\n", row.dump().c_str());
  }
  return 0;
}
