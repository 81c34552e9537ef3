// dtlab-cli launch: torchrun for dtlab. Starts --nproc-per-node copies of this dtlab-cli, each one
// rank of a world of processes (`train --backend socket`), with torchrun's environment: RANK,
// LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Rank 0's output passes
// through untouched (so `launch -- train` prints like `train`); the other ranks' lines get a
// "[rank N] " prefix. When one rank fails the others are stopped (SIGTERM, then SIGKILL) and the
// launcher exits with the failed rank's code; nothing waits forever. The train flags are checked once
// first, as rank 0 will check them: bad ones are one sentence and exit 2 before any rank starts.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "engine/comm/socket_mesh.h"
#include "engine/core/check.h"
#include "engine/core/format.h"

namespace dtlab::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct LaunchArgs {
  int nproc = 1, nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  double timeout_s = 30;
  std::vector<std::string> command;
  CLI::Option* port_opt = nullptr;
};

// One child process and the pipes its output comes through (rank 0 has none: it inherits ours).
struct Child {
  int rank = 0;
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1;
  std::string out_line, err_line;  // a partial line waiting for its end
  std::string diagnosis;           // its last "dtlab-cli: ..." line on stderr, without the prefix
  bool exited = false;
  int code = 0;  // exit code, or 128 + signal
  int stop_signal = 0;  // stopped (SIGSTOP, SIGTSTP, ...) and not continued: it runs nothing, answers no one
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error("cannot find this program's path in /proc/self/exe; run dtlab-cli on Linux");
  return std::string(buf, static_cast<size_t>(n));
}

// The least --timeout: the ranks of a finished run leave their last collective together but exit
// one after another (closing connections, writing outputs, freeing memory; tens to hundreds of
// milliseconds on a loaded machine), and the launcher looks every 100 ms. Below this it could not
// tell a rank that hangs from one that is still exiting, and would fail runs that succeeded.
constexpr double kMinExitTimeoutS = 1.0;

void check_args(const LaunchArgs& a) {
  if (a.command.empty() || a.command[0] != "train")
    throw Error("launch runs 'train' in every process; write: dtlab-cli launch --nproc-per-node N -- train ...");
  for (const std::string& s : a.command)
    if (s == "--backend" || s.rfind("--backend=", 0) == 0)
      throw Error("launch sets --backend socket itself; drop --backend from the train flags");
  if (a.node_rank >= a.nnodes)
    throw Error("--node-rank " + std::to_string(a.node_rank) + " is out of range for --nnodes " +
                std::to_string(a.nnodes) + "; use 0 to " + std::to_string(a.nnodes - 1));
  if (a.nnodes > 1 && a.port_opt->count() == 0)
    throw Error("--nnodes " + std::to_string(a.nnodes) +
                " needs --master-port P and --master-addr of node 0's host, the same on every node");
  if (a.timeout_s < kMinExitTimeoutS)
    throw Error("launch --timeout " + seconds_text(a.timeout_s) + " is shorter than the ranks of a finished run take to exit "
                "one after another (closing their connections, writing their outputs); use at least " +
                seconds_text(kMinExitTimeoutS) + " (train's own --timeout, after --, bounds each collective)");
  if (a.nnodes * a.nproc > 1024)
    throw Error("--nnodes x --nproc-per-node is " + std::to_string(a.nnodes * a.nproc) + " ranks; use at most 1024");
}

// Forks and execs one rank. Rank 0 writes to our own stdout and stderr; the others to pipes.
Child spawn(const std::string& exe, const LaunchArgs& a, int local, int world, int port, int master_fd) {
  Child c;
  c.rank = a.node_rank * a.nproc + local;
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (c.rank != 0 && (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0))
    throw Error(std::string("cannot create a pipe for rank ") + std::to_string(c.rank) + ": " + std::strerror(errno));
  std::vector<std::string> args = {exe};
  args.insert(args.end(), a.command.begin(), a.command.end());
  args.insert(args.end(), {"--backend", "socket"});
  const std::vector<std::pair<const char*, std::string>> env = {
      {"RANK", std::to_string(c.rank)},          {"LOCAL_RANK", std::to_string(local)},
      {"WORLD_SIZE", std::to_string(world)},     {"LOCAL_WORLD_SIZE", std::to_string(a.nproc)},
      {"MASTER_ADDR", a.master_addr},            {"MASTER_PORT", std::to_string(port)}};
  const pid_t parent = ::getpid();
  c.pid = ::fork();
  if (c.pid < 0) throw Error(std::string("cannot start rank ") + std::to_string(c.rank) + ": " + std::strerror(errno));
  if (c.pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // the launcher gone (killed): its ranks go too
    if (::getppid() != parent) ::_exit(1);
    if (c.rank != 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
    }
    for (const auto& [k, v] : env) ::setenv(k, v.c_str(), 1);
    if (c.rank == 0 && master_fd >= 0) {  // rank 0 accepts on the socket the launcher bound: nobody can take the port
      ::fcntl(master_fd, F_SETFD, 0);
      ::setenv(kMasterFdEnv, std::to_string(master_fd).c_str(), 1);
    } else {
      ::unsetenv(kMasterFdEnv);
    }
    // As torchrun: one compute thread per process unless the user says otherwise, since the
    // processes already share the cores.
    if (a.nproc > 1) ::setenv("OMP_NUM_THREADS", "1", 0);
    std::vector<char*> argv;
    for (std::string& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv(exe.c_str(), argv.data());
    const std::string msg = "dtlab-cli: launch could not start " + exe + ": " + std::strerror(errno) + "\n";
    (void)!::write(STDERR_FILENO, msg.data(), msg.size());
    ::_exit(127);
  }
  if (c.rank != 0) {
    ::close(out[1]);
    ::close(err[1]);
    c.out_fd = out[0];
    c.err_fd = err[0];
  }
  return c;
}

// Copies what a rank wrote, a "[rank N] " prefix on each line. Returns false at end of stream.
// A "dtlab-cli: ..." line (the rank's error sentence) is kept in `diagnosis` when given.
bool relay(int& fd, std::string& line, int rank, std::ostream& to, std::string* diagnosis = nullptr) {
  char buf[4096];
  ssize_t n = ::read(fd, buf, sizeof buf);
  if (n < 0 && errno == EINTR) return true;
  if (n > 0) {
    line.append(buf, static_cast<size_t>(n));
    // Whole lines in one write: rank 0 shares this stream, and a line written in pieces (prefix,
    // then text) could be cut by one of its lines.
    std::string lines;
    size_t nl;
    while ((nl = line.find('\n')) != std::string::npos) {
      lines += "[rank " + std::to_string(rank) + "] " + line.substr(0, nl + 1);
      if (diagnosis && line.rfind("dtlab-cli: ", 0) == 0) *diagnosis = line.substr(11, nl - 11);
      line.erase(0, nl + 1);
    }
    to << lines << std::flush;
    return true;
  }
  if (!line.empty()) to << "[rank " << rank << "] " << line << "\n" << std::flush;
  line.clear();
  ::close(fd);
  fd = -1;
  return false;
}

// "SIGSTOP" for the stop signals a rank can get.
std::string signal_name(int sig) {
  switch (sig) {
    case SIGSTOP: return "SIGSTOP";
    case SIGTSTP: return "SIGTSTP";
    case SIGTTIN: return "SIGTTIN";
    case SIGTTOU: return "SIGTTOU";
    default: return "signal " + std::to_string(sig);
  }
}

// Signals the ranks still running; returns them.
std::vector<int> signal_all(std::vector<Child>& children, int sig) {
  std::vector<int> ranks;
  for (Child& c : children)
    if (!c.exited) ::kill(c.pid, sig), ranks.push_back(c.rank);
  return ranks;
}

// After a rank fails, the others usually fail on their own within moments (same bad flag, or the
// lost connection): let them say why before they are stopped.
constexpr double kFailureGraceS = 1.0;
constexpr double kTermGraceS = 3.0;  // SIGTERM, then SIGKILL

// The command's configuration checked once, here, as rank 0 will check it (the launch environment set
// for the check, then restored): bad train flags are one sentence and exit 2 before any process starts,
// instead of the same sentence from every rank. Returns run_cli's code (0: accepted).
int check_command(const LaunchArgs& a, int world, int port, Streams& io) {
  const std::vector<std::pair<const char*, std::string>> env = {
      {"RANK", "0"},                         {"LOCAL_RANK", "0"},
      {"WORLD_SIZE", std::to_string(world)}, {"LOCAL_WORLD_SIZE", std::to_string(a.nproc)},
      {"MASTER_ADDR", a.master_addr},        {"MASTER_PORT", std::to_string(port)}};
  std::vector<std::pair<const char*, std::optional<std::string>>> saved;
  for (const auto& [k, v] : env) {
    const char* was = std::getenv(k);
    saved.push_back({k, was ? std::optional<std::string>(was) : std::nullopt});
    ::setenv(k, v.c_str(), 1);
  }
  std::vector<std::string> args = a.command;
  args.insert(args.end(), {"--backend", "socket"});
  std::ostringstream out, err;
  const int rc = run_cli(args, {out, err, false, Mode::CheckConfig});
  for (const auto& [k, v] : saved) {
    if (v) ::setenv(k, v->c_str(), 1);
    else ::unsetenv(k);
  }
  if (rc != 0) io.err << err.str() << std::flush;
  return rc;
}

int run_launch(LaunchArgs& a, Streams& io) {
  check_args(a);
  // Checked, not run: the command's flags as each rank's train would parse them (its configuration
  // depends on the environment launch gives the ranks).
  if (io.mode == Mode::CheckConfig) return run_cli(a.command, {io.out, io.err, false, Mode::CheckFlags});
  const int world = a.nnodes * a.nproc;
  // A port of our own choosing stays bound from the pick to rank 0's accept: the launcher listens on
  // it and rank 0 inherits the socket (torchrun's pick-then-bind leaves a window another process can
  // take the port in, which once failed a launch here with "Address already in use").
  int port = a.master_port, master_fd = -1;
  if (!a.port_opt->count()) master_fd = listen_on_free_port(a.master_addr, world, port);
  if (const int rc = check_command(a, world, port, io); rc != 0) {
    if (master_fd >= 0) ::close(master_fd);
    return rc;
  }
  const std::string exe = self_exe();
  io.out.flush();
  io.err.flush();
  std::vector<Child> children;
  try {
    for (int local = 0; local < a.nproc; local++) children.push_back(spawn(exe, a, local, world, port, master_fd));
  } catch (...) {
    if (master_fd >= 0) ::close(master_fd);
    signal_all(children, SIGKILL);
    for (Child& c : children) ::waitpid(c.pid, nullptr, 0);
    throw;
  }
  if (master_fd >= 0) ::close(master_fd);  // rank 0 holds it now

  // Relay output and reap children until all are gone. The first failure stops the others; once
  // one rank has ended, the rest get --timeout seconds (their own watchdogs fire well before).
  int failed = -1;                  // index of the first child that failed
  std::vector<int> stopped;         // ranks the launcher had to stop
  Clock::time_point first_exit{}, fail_time{}, stop_sent{};
  bool any_exit = false, stopping = false, killed = false;
  while (true) {
    std::vector<pollfd> fds;
    std::vector<std::pair<size_t, bool>> who;  // child index, is stderr
    for (size_t i = 0; i < children.size(); i++) {
      if (children[i].out_fd >= 0) fds.push_back({children[i].out_fd, POLLIN, 0}), who.push_back({i, false});
      if (children[i].err_fd >= 0) fds.push_back({children[i].err_fd, POLLIN, 0}), who.push_back({i, true});
    }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 100);
    for (size_t k = 0; k < fds.size(); k++) {
      if (!fds[k].revents) continue;
      Child& c = children[who[k].first];
      if (who[k].second) relay(c.err_fd, c.err_line, c.rank, io.err, &c.diagnosis);
      else relay(c.out_fd, c.out_line, c.rank, io.out);
    }
    bool all_exited = true;
    for (size_t i = 0; i < children.size(); i++) {
      Child& c = children[i];
      if (c.exited) continue;
      int status = 0;
      const pid_t got = ::waitpid(c.pid, &status, WNOHANG | WUNTRACED | WCONTINUED);
      if (got == c.pid && WIFSTOPPED(status)) {
        c.stop_signal = WSTOPSIG(status);  // its peers' watchdogs will name it; so will the last line
        all_exited = false;
      } else if (got == c.pid && WIFCONTINUED(status)) {
        c.stop_signal = 0;
        all_exited = false;
      } else if (got == c.pid) {
        c.exited = true;
        c.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (!any_exit) first_exit = Clock::now(), any_exit = true;
        if (c.code != 0 && failed < 0 && !stopping) failed = static_cast<int>(i), fail_time = Clock::now();
        // It finished by itself between the launcher's look and its signal: not a rank it stopped.
        if (c.code == 0) std::erase(stopped, c.rank);
      } else {
        all_exited = false;
      }
    }
    const bool pipes_open = !fds.empty();
    if (all_exited && !pipes_open) break;
    if (all_exited) continue;  // drain what the ranks wrote before exiting
    if (!stopping && ((failed >= 0 && seconds_since(fail_time) > kFailureGraceS) ||
                      (failed < 0 && any_exit && seconds_since(first_exit) > a.timeout_s))) {
      stopped = signal_all(children, SIGTERM);
      stopping = true;
      stop_sent = Clock::now();
    }
    if (stopping && !killed) {  // a stopped rank gets SIGTERM only once it runs again
      for (Child& c : children)
        if (!c.exited && c.stop_signal) ::kill(c.pid, SIGKILL);
    }
    if (stopping && !killed && seconds_since(stop_sent) > kTermGraceS) {
      signal_all(children, SIGKILL);
      killed = true;
    }
    if (fds.empty()) ::usleep(20000);
  }

  if (failed >= 0) {
    const Child& c = children[static_cast<size_t>(failed)];
    std::ostringstream os;
    os << "dtlab-cli: launch: ";
    // A rank stopped by a signal never fails by itself: its peers time out waiting for it. Name it first.
    for (const Child& s : children)
      if (s.stop_signal && &s != &c)
        os << "rank " << s.rank << " was stopped by signal " << s.stop_signal << " (" << signal_name(s.stop_signal)
           << ") and stopped answering; ";
    os << "rank " << c.rank
       << (c.code > 128 ? " was killed by signal " + std::to_string(c.code - 128) : " exited with code " + std::to_string(c.code));
    // A failed collective (code 3): every rank of the world stops with the same root cause (the
    // first diagnosis is sent to all), so a rank whose stderr passes through here tells it.
    if (c.code == 3)
      for (const Child& d : children)
        if (d.code == 3 && !d.diagnosis.empty()) {
          os << ": " << d.diagnosis;
          break;
        }
    os
       << (stopped.empty() ? "" : "; the launcher ended " + ranks_text(stopped)) << "\n";
    io.err << os.str() << std::flush;
    return c.code > 128 || c.code == 0 ? 1 : c.code;
  }
  if (!stopped.empty()) {
    io.err << "dtlab-cli: launch: " << ranks_text(stopped) << " did not exit within " << a.timeout_s
           << " s after the first rank finished; stopped " << (stopped.size() > 1 ? "them" : "it") << "\n" << std::flush;
    return 3;
  }
  return 0;
}

}  // namespace

Runner add_launch_command(CLI::App& app) {
  auto a = std::make_shared<LaunchArgs>();
  app.add_option("--nproc-per-node", a->nproc, "Processes (ranks) to start on this node")->required()->check(whole_number(1, 1024));
  app.add_option("--nnodes", a->nnodes, "Number of nodes (each runs its own launch)")->check(whole_number(1, 1024))->capture_default_str();
  app.add_option("--node-rank", a->node_rank, "This node's index in 0..nnodes-1")->check(whole_number(0, 1023))->capture_default_str();
  app.add_option("--master-addr", a->master_addr, "Address of rank 0's host")->capture_default_str();
  a->port_opt = app.add_option("--master-port", a->master_port, "Port rank 0 listens on (default: a free one; required with --nnodes > 1)")->check(whole_number(1, 65535));
  app.add_option("--timeout", a->timeout_s, "Seconds the other ranks get to exit once one rank has ended")->check(real_number(0, 1e6))->capture_default_str();
  app.add_option("command", a->command, "After --: the subcommand every rank runs, e.g. -- train --strategy ddp ...")->required();
  return [a](Streams& io) { return run_launch(*a, io); };
}

}  // namespace dtlab::cli
