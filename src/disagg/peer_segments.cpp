#include "disagg/peer_segments.h"

#include <sys/ipc.h>
#include <sys/shm.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace kestrel::disagg {
namespace {

// The segment ids of the System V mappings in /proc/PID/maps ("address perms offset dev inode /SYSV<key> ..."),
// each once. `readable` is false when the file could not be opened, with its errno in `error`.
std::vector<int> sysv_ids(uint32_t pid, bool* readable, int* error) {
  std::vector<int> ids;
  std::ifstream f("/proc/" + std::to_string(pid) + "/maps");
  if (!f) {
    *readable = false;
    *error = errno;
    return ids;
  }
  *readable = true;
  for (std::string line; std::getline(f, line);) {
    std::istringstream fields(line);
    std::string range, perms, offset, dev, path;
    long long inode = -1;
    if (!(fields >> range >> perms >> offset >> dev >> inode >> path)) continue;
    if (path.rfind("/SYSV", 0) != 0 || inode < 0) continue;
    const int id = static_cast<int>(inode);
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

}  // namespace

bool PeerSegments::holds(int shmid) const {
  return std::any_of(pinned_.begin(), pinned_.end(), [&](const Pinned& p) { return p.shmid == shmid; });
}

Status PeerSegments::pin(uint32_t pid) {
  bool readable = false;
  int error = 0;
  const std::vector<int> ids = sysv_ids(pid, &readable, &error);
  if (!readable) {
    if (error == EACCES || error == EPERM) return Status::ok();
    return unavailable("disagg: process " + std::to_string(pid) + " is gone (its /proc maps: " +
                       std::strerror(error) + ")");
  }
  // An exiting process's maps read empty once its memory is released: no mapping is no evidence of life, but
  // the segments it created are then removed already, and UCX's unpack fails cleanly or not at all: the caller's
  // liveness check decides.
  for (const int id : ids) {
    if (holds(id)) continue;
    shmid_ds info{};
    if (shmctl(id, IPC_STAT, &info) != 0) {
      if (errno == EINVAL || errno == EIDRM) {
        return unavailable("disagg: a shared-memory segment of process " + std::to_string(pid) +
                           " has been removed (the process is exiting)");
      }
      continue;  // not ours to read (EACCES): leave it to UCX
    }
    if (info.shm_cpid != static_cast<pid_t>(pid)) continue;  // attached there, created by another process
    void* at = shmat(id, nullptr, SHM_RDONLY);
    if (at == reinterpret_cast<void*>(-1)) {
      if (errno == EINVAL || errno == EIDRM) {
        return unavailable("disagg: a shared-memory segment of process " + std::to_string(pid) +
                           " has been removed (the process is exiting)");
      }
      continue;
    }
    pinned_.push_back({id, at});
  }
  return Status::ok();
}

void PeerSegments::release() {
  for (const Pinned& p : pinned_) (void)shmdt(p.address);
  pinned_.clear();
}

}  // namespace kestrel::disagg
