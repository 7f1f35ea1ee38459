// The soak watches the job only from outside, as a user or a launcher would: through the
// master's --events file (trainer::read_job_course) and the processes' exit statuses. It polls
// every 50 ms on its own thread; every process of the job gets one intra-op thread.
#include "bench/chaos_bench.h"

#include <ATen/TensorOperators.h>
#include <fmt/format.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "bench/processes.h"
#include "bench/stats.h"
#include "ferry/core/files.h"
#include "ferry/core/local_world.h"
#include "ferry/core/processes.h"
#include "ferry/remote_module/checkpoint.h"
#include "trainer/event_log.h"

namespace ferry::bench {
namespace {

namespace fs = std::filesystem;

constexpr int kStageWorkers = 4;  // 2 replicas x 2 stages

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// One world of the job: its master and workers, started with a port file of their own; the
// destructor reaps every process still running.
class ChaosWorld {
 public:
  // `spares`: the world's spare workers (s.spares, or none for the run without kills, which
  // checkpoints into `dir`/unbroken).
  ChaosWorld(const ChaosBenchSettings& s, const std::string& dir, int number, bool resume,
             int spares)
      : log_(fmt::format("{}/master-{}.log", dir, number)),
        events_(fmt::format("{}/events-{}.jsonl", dir, number)) {
    const int world_size = 1 + kStageWorkers + spares;
    const std::string port_file = fmt::format("{}/port-{}", dir, number);
    auto env = [&](int rank) {
      auto vars = core::loopback_world_env(rank, world_size, 0, port_file);
      vars["OMP_NUM_THREADS"] = "1";
      return vars;
    };
    // clang-format off
    std::vector<std::string> args = {
        "train", "--model", s.model, "--image-size", std::to_string(s.image_size),
        "--samples", std::to_string(s.samples), "--batch-size", std::to_string(s.batch),
        "--epochs", std::to_string(s.epochs), "--replicas", "2", "--partition", "decoder.0",
        "--spares", std::to_string(spares), "--optimizer", "adam",
        "--checkpoint-dir", dir + (spares > 0 ? "/ckpt" : "/unbroken"),
        "--checkpoint-every-steps", std::to_string(s.checkpoint_every),
        "--events", events_};
    // clang-format on
    if (resume) args.push_back("--resume");
    const std::string bin = core::executable_dir();
    master_ = spawn_process(bin + "/ferry-master", args, env(0), log_);
    for (int rank = 1; rank < world_size; ++rank) {
      workers_["worker" + std::to_string(rank)] =
          spawn_process(bin + "/ferry-worker", {}, env(rank), dir + "/workers.log");
    }
  }

  ~ChaosWorld() {
    if (!master_status_) reap_process(master_, std::chrono::seconds(30));
    for (const auto& [name, pid] : workers_) {
      if (killed_.count(name) == 0) reap_process(pid, std::chrono::seconds(30));
    }
  }

  // This world's course: its takeovers say which workers hold stages now.
  trainer::JobCourse course() const { return trainer::read_job_course(events_); }
  const std::string& log() const { return log_; }

  // The master's exit status once it has exited (-1: a signal ended it).
  std::optional<int> master_exit() {
    if (!master_status_) {
      if (auto raw = core::wait_for_exit(master_, std::chrono::milliseconds(0))) {
        master_status_ = WIFEXITED(*raw) ? WEXITSTATUS(*raw) : -1;
      }
    }
    return master_status_;
  }

  // The workers that hold stages now: the first four, each lost one replaced by its spare.
  std::vector<std::string> holders(const trainer::JobCourse& course) const {
    std::set<std::string> holding;
    for (int rank = 1; rank <= kStageWorkers; ++rank)
      holding.insert("worker" + std::to_string(rank));
    for (const auto& takeover : course.takeovers) {
      for (const trainer::JobCourse::Takeover& t : takeover) {
        holding.erase(t.lost);
        holding.insert(t.spare);
      }
    }
    for (const std::string& gone : killed_) holding.erase(gone);
    return {holding.begin(), holding.end()};
  }

  void kill(const std::string& worker) {
    pid_t pid = workers_.at(worker);
    ::kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    killed_.insert(worker);
  }

 private:
  std::string log_;
  std::string events_;
  pid_t master_ = -1;
  std::optional<int> master_status_;
  std::map<std::string, pid_t> workers_;
  std::set<std::string> killed_;
};

struct Kill {
  std::string worker;
  long step = 0;  // the job's step when it was killed
  Clock::time_point at;
  std::size_t takeovers_before = 0;
  bool recovered = false;
  std::string by;  // "spare workerN", "restart" or "the job's end"
  long steps_lost = 0;
  double stall_s = 0;
};

nlohmann::ordered_json kill_json(const Kill& k) {
  nlohmann::ordered_json j;
  j["worker"] = k.worker;
  j["step"] = k.step;
  j["recovered"] = k.recovered;
  j["by"] = k.by;
  j["steps_lost"] = k.steps_lost;
  j["stall_s"] = k.stall_s;
  return j;
}

// Writes the last checkpoint as one state dict and loads it with Python's torch.load.
nlohmann::ordered_json check_in_python(const std::string& dir) {
  nlohmann::ordered_json out;
  const std::string model = dir + "/model.pt";
  const int exported = run_process(core::executable_dir() + "/ferry-master",
                                   {"export", "--checkpoint-dir", dir + "/ckpt", "--out", model},
                                   {}, dir + "/export.log");
  out["exported"] = exported == 0;
  if (exported != 0 || !fs::exists("/usr/bin/python3")) {
    out["loads_in_python"] = false;
    out["why"] = exported != 0 ? "the export failed" : "no /usr/bin/python3";
    return out;
  }
  const int loaded = run_process(
      "/usr/bin/python3", {"-c", "import sys, torch; print(len(torch.load(sys.argv[1])))", model},
      {}, dir + "/python.log");
  out["loads_in_python"] = loaded == 0;
  std::istringstream lines(core::read_whole_file(dir + "/python.log"));
  std::string last;
  for (std::string line; std::getline(lines, line);) last = line;
  if (loaded == 0) {
    out["tensors"] = std::stol(last);
  } else {
    out["why"] = last;
  }
  return out;
}

// A checkpoint's tensors by "stage/name".
std::map<std::string, at::Tensor> tensors_of(const std::string& dir) {
  std::map<std::string, at::Tensor> out;
  const remote_module::SavedCheckpoint saved = remote_module::read_latest_checkpoint(dir);
  for (const auto& [stage, tensors] : saved.stages) {
    for (const auto& item : tensors) out[stage + "/" + item.key()] = item.value();
  }
  return out;
}

// The same job trained without a kill, and the largest differences between its final weights
// and the soak's: the parameters apart from the batch norms' running statistics and counts.
nlohmann::ordered_json against_unbroken(const ChaosBenchSettings& s, const std::string& dir) {
  nlohmann::ordered_json out;
  const auto start = Clock::now();
  std::optional<int> status;
  {
    ChaosWorld world(s, dir, 99, false, 0);
    while (!(status = world.master_exit()) && seconds_since(start) < 30 * 60) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  out["wall_s"] = seconds_since(start);
  if (!status) {
    out["why"] = "the run without kills did not end within 30 minutes";
    return out;
  }
  if (*status != 0) {
    out["why"] = fmt::format("the run without kills failed (exit status {})", *status);
    return out;
  }
  const std::map<std::string, at::Tensor> soaked = tensors_of(dir + "/ckpt");
  const std::map<std::string, at::Tensor> unbroken = tensors_of(dir + "/unbroken");
  // Parameters; the batch norms' running means and variances; their counts of batches.
  double largest[3] = {0, 0, 0};
  for (const auto& [name, tensor] : unbroken) {
    auto it = soaked.find(name);
    if (it == soaked.end()) {
      out["why"] = fmt::format("{} is not in the soak's checkpoint", name);
      return out;
    }
    const int kind = name.find("num_batches_tracked") != std::string::npos ? 2
                     : name.find("running_") != std::string::npos          ? 1
                                                                           : 0;
    const double d =
        (it->second.to(at::kDouble) - tensor.to(at::kDouble)).abs().max().item<double>();
    largest[kind] = std::max(largest[kind], d);
  }
  out["tensors"] = unbroken.size();
  out["largest_parameter_difference"] = largest[0];
  out["largest_running_statistic_difference"] = largest[1];
  out["largest_batches_tracked_difference"] = largest[2];
  return out;
}

struct Soak {
  std::vector<Kill> kills;
  int restarts = 0;
  bool completed = false;
  std::string ended;  // why the soak stopped short, if it did
};

// The kill in `k` is over once the job trains again: the steps trained again are those the
// takeover or the resume went back.
void recover(Kill& k, const trainer::JobCourse& course) {
  k.recovered = true;
  const bool by_spare = course.takeovers.size() > k.takeovers_before;
  if (k.by.empty()) k.by = by_spare ? "spare " + course.takeovers.back().front().spare : "restart";
  if (by_spare) {
    k.steps_lost = course.takeover_steps_lost.back();
  } else if (k.by == "restart" && !course.resumed_at.empty()) {
    k.steps_lost = std::max<long>(0, k.step - course.resumed_at.back());
  }
  k.stall_s = seconds_since(k.at);
}

void soak(const ChaosBenchSettings& s, const std::string& dir, Soak& out) {
  std::mt19937 random(static_cast<unsigned>(s.seed));
  auto world = std::make_unique<ChaosWorld>(s, dir, 0, false, s.spares);
  long steps_seen_at_kill = 0;
  long next_kill_at = s.every;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const trainer::JobCourse course = world->course();
    Kill* pending = !out.kills.empty() && !out.kills.back().recovered ? &out.kills.back() : nullptr;
    if (pending && course.steps_seen > steps_seen_at_kill) {
      recover(*pending, course);
      next_kill_at = course.step + s.every;
      pending = nullptr;
    }
    if (pending && seconds_since(pending->at) > s.stall_limit_s) {
      out.ended = fmt::format("no training within {} s of killing {}: a hang", s.stall_limit_s,
                              pending->worker);
      return;
    }
    if (std::optional<int> status = world->master_exit()) {
      if (*status == 0) {
        if (pending) pending->by = "the job's end";
        if (pending) recover(*pending, course);
        out.completed = true;
        return;
      }
      if (!pending || pending->by == "restart") {
        out.ended = fmt::format("the job failed (exit status {}); see {}", *status, world->log());
        return;
      }
      // No spare took over: start the world again from the checkpoint, with fresh spares.
      world.reset();
      world = std::make_unique<ChaosWorld>(s, dir, ++out.restarts, true, s.spares);
      pending->by = "restart";
      pending->takeovers_before = 0;
      steps_seen_at_kill = 0;
      continue;
    }
    if (!pending && static_cast<int>(out.kills.size()) < s.kills && course.step >= next_kill_at &&
        fs::exists(dir + "/ckpt/LATEST")) {
      std::vector<std::string> holders = world->holders(course);
      const std::string victim = holders[random() % holders.size()];
      world->kill(victim);
      Kill k;
      k.worker = victim;
      k.step = course.step;
      k.at = Clock::now();
      k.takeovers_before = course.takeovers.size();
      out.kills.push_back(k);
      steps_seen_at_kill = course.steps_seen;
      std::cerr << fmt::format("chaos: killed {} at step {} (kill {} of {})\n", victim, course.step,
                               out.kills.size(), s.kills);
    }
  }
}

}  // namespace

int run_chaos_bench(const ChaosBenchSettings& s) {
  std::string dir = s.work_dir;
  if (dir.empty()) {
    char pattern[] = "/tmp/ferry-chaos-XXXXXX";
    dir = ::mkdtemp(pattern);
  } else {
    fs::create_directories(dir);
  }
  const auto start = Clock::now();
  Soak out;
  soak(s, dir, out);
  const double wall_s = seconds_since(start);

  nlohmann::ordered_json j;
  j["bench"] = "chaos";
  j["checkpoint_every_steps"] = s.checkpoint_every;
  j["kills"] = out.kills.size();
  int survived = 0, by_spare = 0;
  std::vector<double> stalls;
  nlohmann::ordered_json lost = nlohmann::json::array(), each = nlohmann::json::array();
  double longest = 0;
  for (const Kill& k : out.kills) {
    survived += k.recovered;
    by_spare += k.recovered && k.by.rfind("spare", 0) == 0;
    if (k.recovered) lost.push_back(k.steps_lost);
    longest = std::max(longest, k.recovered ? k.stall_s : seconds_since(k.at));
    each.push_back(kill_json(k));
  }
  j["kills_survived"] = survived;
  j["survived_by_spare"] = by_spare;
  j["world_restarts"] = out.restarts;
  j["completed"] = out.completed;
  j["steps_lost"] = lost;
  j["longest_stall_s"] = longest;
  j["wall_s"] = wall_s;
  if (!out.ended.empty()) j["ended"] = out.ended;
  j["each_kill"] = each;
  if (out.completed) j["final_checkpoint"] = check_in_python(dir);
  if (out.completed && s.unbroken) j["unbroken"] = against_unbroken(s, dir);
  if (s.work_dir.empty()) fs::remove_all(dir);
  std::cout << j.dump() << std::endl;
  const bool all = out.completed && survived == static_cast<int>(out.kills.size());
  return all ? 0 : 1;
}

}  // namespace ferry::bench
