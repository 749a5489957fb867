// Test doubles for the server tests: a fake EngineService (deterministic tokens on a timer thread, honours
// cancel, can reject as "queue full"), a trivial ChatFormat ("role: content\n"), and a raw-TCP HTTP client.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "chat/tokenizer.h"
#include "scheduler/engine_service.h"
#include "server/chat_format.h"

namespace kestrel::server::testing {

// Emits script[0], script[1], ... (one token per active request every step) up to max_new_tokens, then a
// final event (kLength if the limit was hit, kStop when the script ran out unless `repeat`). cancel() ends the
// request with kCancelled at the next step. Thread-safe.
class FakeEngine : public EngineService {
 public:
  explicit FakeEngine(std::vector<int32_t> script, std::chrono::milliseconds step = std::chrono::milliseconds(1))
      : script_(std::move(script)), step_(step), thread_([this] { loop(); }) {}
  ~FakeEngine() override {
    {
      std::lock_guard l(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Result<uint64_t> submit(GenerationRequest req) override {
    std::lock_guard l(mu_);
    if (reject_) return unavailable("queue full");
    if (static_cast<int>(req.prompt.size()) >= max_context()) return too_large("prompt too long");
    uint64_t id = next_id_++;
    req.id = id;
    submitted_.push_back(req.params);
    prompts_.push_back(req.prompt);
    active_[id] = Active{std::move(req), 0, false};
    cv_.notify_all();
    return id;
  }
  void cancel(uint64_t id) override {
    std::lock_guard l(mu_);
    cancels_.push_back(id);
    cancel_time_ = std::chrono::steady_clock::now();
    auto it = active_.find(id);
    if (it != active_.end()) it->second.cancelled = true;
  }
  ServiceStats stats() const override {
    std::lock_guard l(mu_);
    ServiceStats s;
    s.running = static_cast<int64_t>(active_.size());
    s.buckets = {0.01, 0.1, 1.0};
    s.ttft_counts = {1, 2, 3};
    s.ttft_n = 3;
    s.ttft_sum = 0.5;
    s.tpot_counts = {0, 0, 0};
    s.step_sequences_buckets = {1, 2, 4};
    s.step_sequences_counts = {1, 3, 4};
    s.step_sequences_sum = 9, s.steps_total = 4, s.step_sequences_max = 3;
    return s;
  }
  bool ready() const override { return ready_; }
  std::string failure() const override {
    std::lock_guard l(mu_);
    return failure_;
  }
  void set_failure(std::string why) { std::lock_guard l(mu_); failure_ = std::move(why); }
  int max_context() const override { return 4096; }

  void set_reject(bool r) { std::lock_guard l(mu_); reject_ = r; }
  void set_repeat(bool r) { std::lock_guard l(mu_); repeat_ = r; }
  std::atomic<bool> ready_{true};
  std::string failure_;
  std::vector<GenerationParams> submitted() const { std::lock_guard l(mu_); return submitted_; }
  std::vector<uint64_t> cancels() const { std::lock_guard l(mu_); return cancels_; }
  size_t active() const { std::lock_guard l(mu_); return active_.size(); }
  std::chrono::steady_clock::time_point cancel_time() const { std::lock_guard l(mu_); return cancel_time_; }

 private:
  struct Active {
    GenerationRequest req;
    int produced = 0;
    bool cancelled = false;
  };
  void loop() {
    std::unique_lock l(mu_);
    while (!quit_) {
      cv_.wait_for(l, step_);
      std::vector<std::pair<std::function<void(const GenerationEvent&)>, GenerationEvent>> out;
      for (auto it = active_.begin(); it != active_.end();) {
        Active& a = it->second;
        GenerationEvent ev;
        bool done = false;
        size_t n = script_.size();
        if (a.cancelled) {
          ev.finish = FinishReason::kCancelled, done = true;
        } else if (a.produced >= a.req.params.max_new_tokens) {
          ev.finish = FinishReason::kLength, done = true;
        } else if (!repeat_ && static_cast<size_t>(a.produced) >= n) {
          ev.finish = FinishReason::kStop, done = true;
        } else {
          ev.token = script_[a.produced % n];
          ev.logprob = -0.25f;
          for (int k = 0; k < a.req.params.top_logprobs; ++k)
            ev.top.push_back({script_[(a.produced + k) % n], -0.25f - k});
          ++a.produced;
        }
        if (done) {
          ev.prompt_tokens = static_cast<int>(a.req.prompt.size());
          ev.completion_tokens = a.produced;
        }
        out.emplace_back(a.req.on_event, ev);
        it = done ? active_.erase(it) : std::next(it);
      }
      l.unlock();
      for (auto& [cb, ev] : out) cb(ev);
      l.lock();
    }
  }

  std::vector<int32_t> script_;
  std::chrono::milliseconds step_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool quit_ = false, reject_ = false, repeat_ = false;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Active> active_;
  std::vector<GenerationParams> submitted_;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<uint64_t> cancels_;
  std::chrono::steady_clock::time_point cancel_time_{};
  std::thread thread_;
};

class PlainOutputParser : public OutputParser {
 public:
  ParsedDelta push(std::string_view text) override { return ParsedDelta{{}, std::string(text), {}, false}; }
  ParsedDelta finish() override { return {}; }
};

// "role: content\n" per message (+ "assistant: "); images are unsupported.
class TrivialFormat : public ChatFormat {
 public:
  explicit TrivialFormat(const chat::Tokenizer& tok) : tok_(tok) {}
  Result<std::vector<int32_t>> render(const RenderInput& in) const override {
    std::string text;
    for (const auto& m : *in.messages) {
      text += m.role + ": " + m.content;
      for (const auto& p : m.content_parts) {
        if (p.kind != ContentPart::Kind::kText) return unsupported("images are not supported by this format");
        text += p.text;
      }
      text += "\n";
    }
    if (in.add_generation_prompt) text += "assistant: ";
    return tok_.encode(text, chat::SpecialMode::kAsText);
  }
  std::unique_ptr<OutputParser> make_output_parser(const ReasoningOptions&) const override {
    return std::make_unique<PlainOutputParser>();
  }
  std::vector<int32_t> stop_token_ids() const override { return {100257}; }

 private:
  const chat::Tokenizer& tok_;
};

// Minimal blocking HTTP client over a raw socket (for tests only).
class RawClient {
 public:
  explicit RawClient(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~RawClient() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool ok() const { return ok_; }
  bool send(std::string_view data) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads until `pred(buffer)` or EOF / timeout; returns what arrived.
  template <typename Pred>
  std::string read_until(Pred pred, std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!pred(buf_)) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char tmp[16384];
      ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
      if (n <= 0) {
        eof_ = true;
        break;
      }
      buf_.append(tmp, static_cast<size_t>(n));
    }
    return buf_;
  }
  // Reads one full response (Content-Length or chunked). Returns {status, headers+body raw}; status 0 if none.
  struct Response {
    int status = 0;
    std::string head, body;
  };
  Response read_response(std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
    Response r;
    read_until([](const std::string& b) { return b.find("\r\n\r\n") != std::string::npos; }, timeout);
    size_t he = buf_.find("\r\n\r\n");
    if (he == std::string::npos || buf_.size() < 12) return r;
    r.head = buf_.substr(0, he + 4);
    r.status = std::atoi(buf_.c_str() + 9);
    std::string lower = r.head;
    for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    size_t cl = lower.find("content-length:");
    if (cl != std::string::npos) {
      size_t len = std::strtoull(lower.c_str() + cl + 15, nullptr, 10);
      read_until([&](const std::string& b) { return b.size() >= he + 4 + len; }, timeout);
      r.body = buf_.substr(he + 4, len);
      buf_.erase(0, std::min(buf_.size(), he + 4 + len));
    } else if (lower.find("transfer-encoding: chunked") != std::string::npos) {
      read_until([&](const std::string& b) { return b.find("\r\n0\r\n\r\n", he) != std::string::npos; }, timeout);
      size_t pos = he + 4;
      while (pos < buf_.size()) {  // de-chunk
        size_t eol = buf_.find("\r\n", pos);
        if (eol == std::string::npos) break;
        size_t len = std::strtoull(buf_.c_str() + pos, nullptr, 16);
        if (len == 0) {
          pos = eol + 4;
          break;
        }
        r.body += buf_.substr(eol + 2, len);
        pos = eol + 2 + len + 2;
      }
      buf_.erase(0, std::min(pos, buf_.size()));
    }
    return r;
  }
  bool eof() const { return eof_; }

 private:
  int fd_ = -1;
  bool ok_ = false, eof_ = false;
  std::string buf_;
};

inline std::string http_post(const std::string& path, const std::string& body, const std::string& extra = {}) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n" + extra + "\r\n" + body;
}

}  // namespace kestrel::server::testing
