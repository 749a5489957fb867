// The shared tier (L4): objects in a Redis server that several Kestrel servers share, under
// `<key_prefix><64 hex of key>` as plain string values. Writes use SET ... NX (objects are immutable: the first
// writer wins, later ones are no-ops); eviction is the server's business (maxmemory + an LRU policy), so a get()
// may miss at any time.
//
// One connection, made on first use. Every call is bounded: connecting by connect_timeout_ms, each command by
// command_timeout_ms of silence (socket send/receive timeouts: a server that stops answering is an error after that
// long; one that keeps trickling bytes is not cut off), so a stalled or unreachable server gives an error. After an
// I/O error or timeout the connection is dropped (its reply stream can no longer be trusted) and the next call
// connects again; reply errors from the server (OOM, ...) keep it. Calls are serialised on the connection.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "cache/tier_store.h"

struct redisContext;  // hiredis; only redis_store.cpp sees it

namespace kestrel {

struct RedisStoreOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string unix_socket;  // when set, used instead of host:port
  std::string key_prefix = "kestrel:v1:";
  int connect_timeout_ms = 500;
  int command_timeout_ms = 500;
};

class RedisStore final : public TierStore {
 public:
  // Checks the options; does not connect (a server that is down at start is an error on the first call).
  static Result<std::unique_ptr<RedisStore>> create(RedisStoreOptions opts);
  ~RedisStore() override;
  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  Status put(const Digest& key, std::span<const uint8_t> bytes) override;
  Result<std::optional<std::vector<uint8_t>>> get(const Digest& key) override;
  Result<bool> contains(const Digest& key) override;
  Status erase(const Digest& key) override;
  // objects and bytes are -1: the store is shared and evicts on its own.
  TierStoreStats stats() const override;

  // Round trip to the server (PING).
  Status ping();
  // Connections made so far (1 + reconnects).
  int64_t connects() const;
  std::string redis_key(const Digest& key) const { return opts_.key_prefix + to_hex(key); }

 private:
  struct Reply;
  explicit RedisStore(RedisStoreOptions opts) : opts_(std::move(opts)) {}
  // Runs one command on the (re)connected context; an I/O failure drops the connection. Caller holds mu_.
  Result<Reply> command(int argc, const char** argv, const size_t* lens);
  Status connect_locked();
  void disconnect_locked();

  RedisStoreOptions opts_;
  mutable std::mutex mu_;
  redisContext* ctx_ = nullptr;
  int64_t connects_ = 0;
  TierStoreStats stats_;
};

}  // namespace kestrel
