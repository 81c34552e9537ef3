// Saves never lose the last good checkpoint (engine/io/atomic_file.h, sharded_checkpoint.h): a
// sharded save is written aside and swapped in whole, so killing it at any moment leaves a loadable
// directory; a killed single-file save leaves a temp file that the next save removes, and SIGTERM
// removes it at once.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/io/atomic_file.h"
#include "engine/io/checkpoint.h"
#include "engine/io/sharded_checkpoint.h"
#include "engine/train/train.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace dtlab;

namespace {

TrainConfig fsdp_config(int world, int64_t steps, const std::string& dir) {
  TrainConfig c;
  c.strategy = Strategy::Fsdp;
  c.world_size = world;
  c.model = ModelSpec::parse("mlp:2,32,32,3");
  c.batch = 16;
  c.steps = steps;
  c.timeout_s = 20;
  c.save_sharded_path = dir;
  return c;
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

// A process id that runs nothing now (so a temp file named with it is stale).
long dead_pid() {
  for (long pid = 4000000; pid > 1000; pid -= 7)
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return pid;
  return -1;
}

// Runs dtlab-cli with `args` and sends it `sig` after `after_s` seconds (if it still runs); returns
// how it ended: the exit code, or 128 + the signal that killed it.
int run_and_signal(const std::vector<std::string>& args, double after_s, int sig) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> argv{const_cast<char*>(DTLAB_CLI_PATH)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
    ::execv(DTLAB_CLI_PATH, argv.data());
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(after_s);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ::kill(pid, sig);
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

double seconds_of(const std::vector<std::string>& args) {
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(run_and_signal(args, 600, SIGKILL) == 0);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_SUITE("saves") {
  TEST_CASE("a sharded save replaces the last checkpoint whole and leaves nothing aside") {
    test::TempDir dir;
    const std::string s = dir.file("s");
    Trainer(fsdp_config(4, 2, s)).run();
    CHECK(read_sharded_checkpoint_info(s).step == 2);
    CHECK(fs::exists(dir.file("s/" + shard_file_name(3, 4))));
    // A staging directory left by a save that was killed: replaced, then gone.
    fs::create_directories(dir.file(".s.saving"));
    std::ofstream(dir.file(".s.saving/rank-00000-of-00002.safetensors")) << "half";
    Trainer(fsdp_config(2, 3, s + "/")).run();  // a trailing slash names the same directory
    CHECK(read_sharded_checkpoint_info(s).step == 3);
    CHECK(names_in(s) == std::vector<std::string>{"index.json", shard_file_name(0, 2), shard_file_name(1, 2)});
    CHECK(names_in(dir.path) == std::vector<std::string>{"s"});
    Model m(ModelSpec::parse("mlp:2,32,32,3"), nullptr, 0);
    CHECK(load_sharded_checkpoint(s, m).step == 3);
  }

  TEST_CASE("a directory with other files is refused before training: the save replaces it whole") {
    test::TempDir dir;
    fs::create_directories(dir.file("mine"));
    std::ofstream(dir.file("mine/notes.txt")) << "keep me";
    CHECK_THROWS_WITH_AS(Trainer{fsdp_config(2, 1, dir.file("mine"))},
                         doctest::Contains("holds notes.txt, which is not part of a sharded checkpoint"), Error);
    CHECK(fs::exists(dir.file("mine/notes.txt")));
    CHECK_THROWS_WITH_AS(Trainer{fsdp_config(2, 1, dir.file("nodir/s"))}, doctest::Contains("does not exist; create it first"),
                         Error);
  }

  TEST_CASE("killing a sharded save at any moment leaves the last good checkpoint loadable") {
    test::TempDir dir;
    const std::string s = dir.file("s");
    const std::vector<std::string> args = {"train", "--strategy", "fsdp", "--world", "2", "--model", "mlp:2,256,256,256,3",
                                           "--steps", "3", "--batch", "16", "--save-sharded", s};
    const double full = seconds_of(args);  // the first save, complete
    Model m(ModelSpec::parse("mlp:2,256,256,256,3"), nullptr, 0);
    REQUIRE(load_sharded_checkpoint(s, m).step == 3);
    int killed = 0;
    // The sanitizer runs (DTLAB_TEST_QUICK) kill at every other moment.
    for (int i = 0; i < 16; i += test::quick() ? 2 : 1) {
      // Kill times spread over the run's second half, where it saves.
      const double at = full * (0.5 + 0.6 * i / 16.0);
      CAPTURE(at);
      if (run_and_signal(args, at, SIGKILL) == 128 + SIGKILL) killed++;
      CHECK_NOTHROW(load_sharded_checkpoint(s, m));
      CHECK(!fs::exists(dir.file(".s.old")));
    }
    MESSAGE("killed " << killed << " of " << (test::quick() ? 8 : 16) << " saves; the checkpoint loaded after each");
  }

  // Every writer (checkpoints, traces, schedules, logits, screenshots) saves through AtomicFile, which
  // renames its temp file over the target: over a FIFO, a socket or a device node that would replace
  // the node (as root, /dev/full itself). The output check and AtomicFile both refuse such a target.
  TEST_CASE("an output path that is a FIFO, a socket or a device is refused and left as it was") {
    test::TempDir dir;
    const std::string fifo = dir.file("pipe");
    REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
    CHECK_THROWS_WITH_AS(check_output_path("--save", fifo),
                         ("--save " + fifo + " is a FIFO (a named pipe), which a save would replace with a file; give the path of a regular file").c_str(),
                         Error);
    CHECK_THROWS_WITH_AS(check_output_path("--logits", "/dev/null"), doctest::Contains("/dev/null is a device"), Error);
    CHECK_THROWS_WITH_AS(AtomicFile{fifo}, doctest::Contains("cannot save: it is a FIFO"), Error);
    CHECK(not_a_regular_output(dir.file("none")).empty());
    CHECK(not_a_regular_output(dir.path).empty());  // a directory: check_output_path's own sentence
    // Through the CLI: exit 2, one sentence, the FIFO still a FIFO and nothing beside it.
    for (const std::string& args : {"train --steps 1 --model mlp:2,8,3 --save " + fifo, "schedule --csv " + fifo,
                                    "train --steps 1 --model mlp:2,8,3 --trace " + fifo}) {
      const test::ShellResult r = test::shell(std::string(DTLAB_CLI_PATH) + " " + args);
      CHECK_MESSAGE(r.code == 2, args << ": " << r.out);
      CHECK_MESSAGE(test::contains(r.out, fifo + " is a FIFO"), args << ": " << r.out);
      CHECK(fs::is_fifo(fifo));
      CHECK(names_in(dir.path) == std::vector<std::string>{"pipe"});
    }
  }

  TEST_CASE("stale temp files of a killed save are removed by the next save, SIGTERM removes its own") {
    test::TempDir dir;
    const std::string out = dir.file("model.safetensors");
    const long dead = dead_pid();
    REQUIRE(dead > 0);
    const std::string stale = out + ".tmp." + std::to_string(dead) + ".0";
    const std::string live = out + ".tmp." + std::to_string(::getppid()) + ".0";  // a process that runs: kept
    const std::string other = dir.file("other.safetensors.tmp." + std::to_string(dead) + ".0");  // another file's: kept
    for (const std::string& f : {stale, live, other}) std::ofstream(f) << "partial";
    Model m(ModelSpec::parse("mlp:2,8,3"), nullptr, 0);
    save_checkpoint(out, m, 1, {});
    CHECK(!fs::exists(stale));
    CHECK(fs::exists(live));
    CHECK(fs::exists(other));
    fs::remove(live);
    fs::remove(other);

    // SIGTERM while dtlab-cli runs and saves: no temp file stays.
    const std::vector<std::string> args = {"train", "--model", "mlp:2,1024,1024,1024,3", "--steps", "2", "--save", out};
    const double full = seconds_of(args);
    for (int i = 0; i < 8; i += test::quick() ? 2 : 1) {
      run_and_signal(args, full * (0.4 + 0.08 * i), SIGTERM);
      for (const std::string& name : names_in(dir.path)) CHECK(name == "model.safetensors");
    }
  }
}
