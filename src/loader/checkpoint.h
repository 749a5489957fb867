// A Hugging Face checkpoint directory: config.json plus one model.safetensors or shards listed in
// model.safetensors.index.json. Tensors are looked up by name with strict dtype/shape checks; every
// lookup is recorded so the binder can report tensors the model never used.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "base/progress.h"
#include "base/result.h"
#include "loader/safetensors.h"

namespace kestrel {

class Checkpoint {
 public:
  static Result<Checkpoint> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // Any dtype in `dtypes` accepted (empty = any); shape must match exactly (empty = any).
  // The returned data is aligned to its element size: safetensors offsets need not be, so a
  // misaligned tensor is copied once into owned, aligned memory (typed loads stay defined).
  Result<TensorView> get(const std::string& name, const std::vector<DType>& dtypes,
                         const std::vector<int64_t>& shape);
  // get() for a caller that reads only part of the tensor (a tensor-parallel slice): `counted` bytes, not the
  // whole tensor's, are added to bound_bytes() the first time the tensor is fetched.
  Result<TensorView> get_part(const std::string& name, const std::vector<DType>& dtypes,
                              const std::vector<int64_t>& shape, uint64_t counted);
  // The checks of get() without touching the data: the tensor exists with one of `dtypes` and `shape`.
  // It then counts as used (a tensor the model accounts for but does not bind yet, e.g. the vision tower).
  Status expect(const std::string& name, const std::vector<DType>& dtypes, const std::vector<int64_t>& shape);
  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  // Names never fetched through get() or accounted for by expect().
  std::vector<std::string> unused() const;
  // Bytes of the distinct tensors fetched through get() or get_part() (what the model reads; tensors only accounted for by
  // expect(), such as another rank's experts in a cell, are not counted).
  uint64_t bound_bytes() const { return bound_bytes_; }
  // Stored bytes of a tensor (0 when absent), from the header alone.
  uint64_t tensor_bytes(const std::string& name) const;
  // Where a tensor lives, for error messages.
  std::string file_of(const std::string& name) const;
  size_t size() const { return tensors_.size(); }
  // Shows binding progress on a terminal (base/progress.h): tensors and bytes fetched through get()/expect()
  // of the checkpoint's totals. The line ends when every tensor is used, at finish_progress() or at destruction.
  void show_progress(const std::string& label);
  void finish_progress() { progress_.reset(); }

 private:
  struct Loc {
    size_t file;
    const SafetensorsEntry* entry;
  };
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Loc> tensors_;
  std::set<std::string> used_;
  std::set<std::string> fetched_;
  uint64_t bound_bytes_ = 0;
  std::vector<std::unique_ptr<uint64_t[]>> aligned_copies_;
  std::unique_ptr<Progress> progress_;
};

}  // namespace kestrel
