// CLI subcommands. Each returns the process exit code and prints one-line errors to stderr.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace kestrel::app {

int cmd_generate(const std::vector<std::string>& args);
int cmd_make_model(const std::vector<std::string>& args);
int cmd_bench(const std::vector<std::string>& args);
int cmd_chat(const std::vector<std::string>& args);
int cmd_serve(const std::vector<std::string>& args);
int cmd_quantize(const std::vector<std::string>& args);
int cmd_plan(const std::vector<std::string>& args);

// Resolves --model (a checkpoint dir), else --preset (a generated random-weight model, cached), else the
// shipped trained default model (default_model_dir()).
std::string resolve_model_or_default(const std::string& model_flag, bool verbose, int& rc,
                                     const std::string& preset = "");

// Prints the model's load notes (one stderr line each, prefixed with the model directory) when verbose.
void print_load_notes(const Engine& engine, const std::string& dir, bool verbose);
// The bytes of an image file, refused before reading when larger than the per-image limit; errors start with
// `label` (e.g. "--image cat.png").
Result<std::vector<uint8_t>> read_image_file(const std::string& path, const std::string& label);

}  // namespace kestrel::app
