#include "base/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kestrel {

namespace {
std::chrono::milliseconds first_draw_delay() {
  const char* e = std::getenv("KESTREL_PROGRESS_DELAY_MS");
  return std::chrono::milliseconds(e && *e ? std::strtol(e, nullptr, 10) : 200);
}

std::string bytes_text(double b) {
  char buf[32];
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  return buf;
}

std::string duration_text(double s) {
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s / 3600), static_cast<int>(s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  else std::snprintf(buf, sizeof buf, "%.0fs", s);
  return buf;
}
}  // namespace

bool progress_on_terminal() {
  const char* e = std::getenv("KESTREL_PROGRESS");
  return ::isatty(STDERR_FILENO) && !(e && std::strcmp(e, "0") == 0);
}

Progress::Progress(std::string label, uint64_t total_bytes, uint64_t total_items, const char* item_name)
    : label_(std::move(label)), item_name_(item_name), total_bytes_(total_bytes), total_items_(total_items),
      start_(std::chrono::steady_clock::now()), last_draw_(start_), enabled_(progress_on_terminal()) {}

void Progress::set(uint64_t bytes, uint64_t items) {
  bytes_ = bytes, items_ = items;
  if (!enabled_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - start_ < first_draw_delay()) return;
  if (drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(false);
}

void Progress::restart(std::string label, uint64_t total_bytes, uint64_t total_items) {
  if (drawn_ && !finished_) draw(true);  // keep the finished phase on its own line
  label_ = std::move(label), total_bytes_ = total_bytes, total_items_ = total_items;
  bytes_ = items_ = 0, drawn_ = finished_ = false, last_width_ = 0;
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

void Progress::finish() {
  if (finished_) return;
  if (drawn_) draw(true);
  finished_ = true;
}

std::string Progress::line() const {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string s = label_ + ":";
  char buf[96];
  if (total_items_ || items_) {
    if (total_items_) std::snprintf(buf, sizeof buf, " %llu/%llu %s", static_cast<unsigned long long>(items_),
                                    static_cast<unsigned long long>(total_items_), item_name_);
    else std::snprintf(buf, sizeof buf, " %llu %s", static_cast<unsigned long long>(items_), item_name_);
    s += buf;
  }
  if (total_bytes_ || bytes_) {
    s += (total_items_ || items_) ? "," : "";
    s += " " + bytes_text(static_cast<double>(bytes_));
    if (total_bytes_) s += " / " + bytes_text(static_cast<double>(total_bytes_));
  }
  // Fraction done: by bytes when their total is known, else by items.
  double frac = -1;
  if (total_bytes_) frac = static_cast<double>(bytes_) / static_cast<double>(total_bytes_);
  else if (total_items_) frac = static_cast<double>(items_) / static_cast<double>(total_items_);
  if (frac >= 0) {
    std::snprintf(buf, sizeof buf, " (%3.0f%%)", 100.0 * (frac > 1 ? 1 : frac));
    s += buf;
  }
  if (secs > 0) {
    if (total_bytes_ || bytes_) s += ", " + bytes_text(static_cast<double>(bytes_) / secs) + "/s";
    else {
      std::snprintf(buf, sizeof buf, ", %.1f %s/s", static_cast<double>(items_) / secs, item_name_);
      s += buf;
    }
  }
  if (frac > 0 && frac < 1) s += ", " + duration_text(secs * (1 - frac) / frac) + " left";
  else if (frac >= 1 || finished_) s += ", " + duration_text(secs);
  return s;
}

void Progress::draw(bool final) {
  std::string s = line();
  const size_t width = s.size();
  if (width < last_width_) s.append(last_width_ - width, ' ');  // clear what the previous draw left
  last_width_ = width;
  std::fprintf(stderr, "\r%s%s", s.c_str(), final ? "\n" : "");
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace kestrel
