// A child process driven through two pipes (its stdin and stdout), line by line, with bounded reads; killed and
// reaped when the object goes. Shared by the tests whose peer is another process.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <string>
#include <thread>
#include <vector>

#include "disagg/deadline.h"

namespace kestrel::disagg::testing {

using std::chrono::milliseconds;

// The child process and the two pipes to it.
struct Child {
  pid_t pid = -1;
  int to = -1, from = -1;
  std::string buffered;

  // Runs `args` (args[0]: the program) with its stdin and stdout connected to this object.
  void spawn(const std::vector<std::string>& args) {
    int in[2], out[2];
    ASSERT_EQ(pipe(in), 0);
    ASSERT_EQ(pipe(out), 0);
    pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[1]);
      close(out[0]);
      std::vector<char*> argv;
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to = in[1];
    from = out[0];
  }
  // One line from the child's stdout within the limit ("" on timeout or end of file).
  std::string line(milliseconds limit) {
    Deadline d = Deadline::after(limit);
    while (buffered.find('\n') == std::string::npos) {
      auto left = std::chrono::ceil<milliseconds>(d.at() - Clock::now()).count();
      pollfd p{from, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(std::max<long>(left, 0))) <= 0) return "";
      char buf[4096];
      ssize_t n = read(from, buf, sizeof buf);
      if (n <= 0) return "";
      buffered.append(buf, static_cast<size_t>(n));
    }
    size_t nl = buffered.find('\n');
    std::string l = buffered.substr(0, nl);
    buffered.erase(0, nl + 1);
    return l;
  }
  void write_line(const std::string& s) {
    std::string l = s + "\n";
    ASSERT_EQ(write(to, l.data(), l.size()), static_cast<ssize_t>(l.size()));
  }
  // Exit status, or -1 if it did not end within the limit.
  int reap(milliseconds limit) {
    Deadline d = Deadline::after(limit);
    while (!d.expired()) {
      int status = 0;
      pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        pid = -1;
        return status;
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
    return -1;
  }
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (to >= 0) close(to);
    if (from >= 0) close(from);
  }
};

}  // namespace kestrel::disagg::testing
