// Where the memory of a CachePools' arenas (KDA slots, MLA pages, indexer pages) comes from. By default the heap;
// a transport that writes into the pools from another process supplies memory it can reach directly (the decode
// side of prefill/decode disaggregation: shared memory allocated through UCX, pd/decode_arenas.h). The memory is
// held until the last shared_ptr to it goes; it need not be zeroed.
#pragma once

#include <cstddef>
#include <memory>

#include "base/result.h"

namespace kestrel {

class ArenaSource {
 public:
  virtual ~ArenaSource() = default;
  // `bytes` bytes, aligned at least as malloc aligns, for `what` (a name for error messages).
  virtual Result<std::shared_ptr<std::byte>> allocate(size_t bytes, const char* what) = 0;
};

}  // namespace kestrel
