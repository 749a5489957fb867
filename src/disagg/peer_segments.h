// PeerSegments: attaches, read-only, the System V shared-memory segments that a peer process on this host created,
// so that they outlive that process until released here.
//
// Why: unpacking the remote key of a region a same-host peer allocated through UCX (sysv) makes UCX attach the
// peer's segment (shmat). UCX marks its segments for removal as soon as it has attached them, so a segment exists
// only while some process has it attached; when the peer dies, the kernel removes it. In UCX 1.13 an unpack whose
// segment is gone fails, and its error path releases the key it did not finish unpacking: SIGSEGV in the
// unpacking process. A liveness check before the unpack leaves a few microseconds in which the peer can die.
// Attached here first, the segment cannot vanish between the check and UCX's own shmat; if it is already gone,
// the attach here fails and nothing is unpacked.
//
// Segments are found through /proc/PID/maps (a System V mapping reads "/SYSV<key>" with the segment id in the
// inode column) and kept only when the peer created them (shm_cpid). Regions UCX allocated with its posix
// transport are not covered (their unpack opens /proc/PID/fd/N, which no attach here can keep).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/result.h"

namespace kestrel::disagg {

class PeerSegments {
 public:
  PeerSegments() = default;
  ~PeerSegments() { release(); }
  PeerSegments(const PeerSegments&) = delete;
  PeerSegments& operator=(const PeerSegments&) = delete;

  // Attaches every segment process `pid` created and has mapped, not attached here yet. kUnavailable when the
  // process is gone (its maps no longer exist) or one of its segments has been removed meanwhile (it died).
  // A maps file this process may not read (another user) attaches nothing and is not an error: the caller's
  // liveness check is then all there is.
  Status pin(uint32_t pid);
  // Detaches everything (after the keys unpacked through the segments are released).
  void release();

  size_t size() const { return pinned_.size(); }
  bool holds(int shmid) const;

 private:
  struct Pinned {
    int shmid;
    void* address;
  };
  std::vector<Pinned> pinned_;
};

}  // namespace kestrel::disagg
