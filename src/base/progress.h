// Progress of one long job (loading a checkpoint, quantizing, generating the default model) on stderr:
// one line redrawn in place with tensors and bytes done of their totals, the rate and the time left.
//
// Drawn only when stderr is a terminal, so pipes, logs and tests stay quiet (KESTREL_PROGRESS=0 turns it off
// on a terminal too), and only once the job has run for `delay` (default 200 ms; KESTREL_PROGRESS_DELAY_MS),
// so jobs that finish at once print nothing. At most ten redraws a second; finish() ends the line.
// Not thread-safe: one owner updates it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace kestrel {

class Progress {
 public:
  // A total of 0 is unknown: no percentage or time left for that unit.
  Progress(std::string label, uint64_t total_bytes, uint64_t total_items, const char* item_name = "tensors");
  ~Progress() { finish(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(uint64_t bytes, uint64_t items = 1) { set(bytes_ + bytes, items_ + items); }
  void set(uint64_t bytes, uint64_t items);
  // Starts the next phase on the same line: new label and totals, counts and clock reset.
  void restart(std::string label, uint64_t total_bytes, uint64_t total_items);
  // Draws the final state (if anything was drawn) and ends the line. Idempotent.
  void finish();

  // The line as drawn (no carriage return): for tests and for callers that log it.
  std::string line() const;

 private:
  void draw(bool final);
  std::string label_;
  const char* item_name_;
  uint64_t total_bytes_, total_items_, bytes_ = 0, items_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool enabled_, drawn_ = false, finished_ = false;
  size_t last_width_ = 0;
};

// True when Progress draws: stderr is a terminal and KESTREL_PROGRESS is not "0".
bool progress_on_terminal();

}  // namespace kestrel
