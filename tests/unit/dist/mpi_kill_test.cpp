// A dead rank ends the job quickly: run 4 ranks of all_reduce_sum under mpiexec, SIGKILL rank 1 mid-loop, and
// require mpiexec to exit non-zero within 10 s with no rank process left running. Open MPI 4.1 has no fault
// tolerance; what ends the job is mpirun noticing that a rank died from a signal (orte_abort_on_non_zero_status,
// on by default) and killing the others. This test is the guard that it keeps doing so with our flags.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

int read_pid(const std::string& path) {
  std::ifstream f(path);
  int pid = 0;
  f >> pid;
  return pid;
}

// Running = exists and is not a zombie (a zombie has ended; only its parent's wait is missing).
bool running(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  if (!f) return false;
  std::string stat;
  std::getline(f, stat);
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

TEST(MpiKill, SigkillOfOneRankEndsTheJobWithinTenSeconds) {
  char tmpl[] = "/tmp/kestrel_dist_kill_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  struct RemoveDir {  // also on a failed ASSERT
    std::string path;
    ~RemoveDir() { std::filesystem::remove_all(path); }
  } remove_dir{dir};
  constexpr int kRanks = 4;
  std::vector<std::string> args{KESTREL_MPIEXEC, "-n", std::to_string(kRanks)};
  for (const std::string& f : split(KESTREL_MPIEXEC_FLAGS)) args.push_back(f);
  args.push_back(KESTREL_KILL_HELPER);
  args.push_back(dir);
  const pid_t mpirun = fork();
  ASSERT_GE(mpirun, 0);
  if (mpirun == 0) {
    setpgid(0, 0);  // own process group: the test can clean up everything if mpirun hangs
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  setpgid(mpirun, mpirun);
  // Wait until every rank is inside the loop.
  std::vector<int> pids(kRanks, 0);
  const auto ready_deadline = Clock::now() + std::chrono::seconds(60);
  int early_status = 0;
  for (int r = 0; r < kRanks; ++r) {
    while ((pids[r] = read_pid(dir + "/rank" + std::to_string(r) + ".pid")) == 0 && Clock::now() < ready_deadline) {
      ASSERT_NE(waitpid(mpirun, &early_status, WNOHANG), mpirun)
          << "mpiexec exited before the ranks started (as root it needs OMPI_ALLOW_RUN_AS_ROOT=1 and "
             "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, which ctest sets)";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  for (int r = 0; r < kRanks; ++r) ASSERT_GT(pids[r], 0) << "rank " << r << " never started its loop";

  ASSERT_EQ(kill(pids[1], SIGKILL), 0);
  const auto killed = Clock::now();
  int status = 0;
  bool exited = false;
  while (Clock::now() - killed < std::chrono::seconds(10)) {
    if (waitpid(mpirun, &status, WNOHANG) == mpirun) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  if (!exited) {
    kill(-mpirun, SIGKILL);
    for (int pid : pids) kill(pid, SIGKILL);
    waitpid(mpirun, &status, 0);
  }
  ASSERT_TRUE(exited) << "mpiexec still running 10 s after rank 1 was killed";
  const bool failed = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
  EXPECT_TRUE(failed) << "mpiexec exited 0 after a rank was killed";
  std::printf("mpiexec ended %.2f s after SIGKILL of rank 1 (exit status %d)\n", seconds,
              WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  // No orphan: every rank has ended (give the kernel a moment to finish tearing them down).
  const auto orphan_deadline = Clock::now() + std::chrono::seconds(2);
  for (int r = 0; r < kRanks; ++r) {
    while (running(pids[r]) && Clock::now() < orphan_deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(running(pids[r])) << "rank " << r << " (pid " << pids[r] << ") outlived mpiexec";
    if (running(pids[r])) kill(pids[r], SIGKILL);
  }
}

}  // namespace
