#include "ferry/trainer/plan_command.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "ferry/core/log.h"
#include "ferry/core/process_memory.h"
#include "ferry/core/processes.h"
#include "ferry/rpc/error.h"
#include "ferry/trainer/worker_loop.h"
#include "trainer/block_cost_cache.h"
#include "trainer/image_size_json.h"
#include "trainer/plan_checks.h"
#include "trainer/plan_costs.h"
#include "trainer/planner.h"
#include "trainer/run_report.h"
#include "trainer/stage_plan.h"

namespace ferry::trainer {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<std::string> block_names(const std::vector<models::BlockCost>& costs) {
  std::vector<std::string> out;
  for (const auto& c : costs) out.push_back(c.name);
  return out;
}

std::string tail_of(const std::string& text, size_t lines) {
  size_t at = text.size();
  for (size_t k = 0; k <= lines && at != std::string::npos && at > 0; ++k) {
    at = text.rfind('\n', at - 1);
  }
  return at == std::string::npos ? text : text.substr(at + 1);
}

// Where a job ran out of memory, as its error says: ": <what failed>: out of memory: ..." (its
// first out-of-memory line, from the failed call on and without the advice), or "" if it does
// not say.
std::string where_out_of_memory(const std::string& output) {
  const size_t at = output.find("out of memory: ");
  if (at == std::string::npos) return "";
  const size_t line_start = output.rfind('\n', at);
  const size_t begin = line_start == std::string::npos ? 0 : line_start + 1;
  std::string line = output.substr(begin, output.find('\n', at) - begin);
  if (const size_t advice = line.find("; to fit,"); advice != std::string::npos) {
    line.resize(advice);
  }
  const size_t failed = line.find("failed: ");
  return ": " + (failed == std::string::npos ? line : line.substr(failed + 8));
}

// The request as `c`'s check runs it: in a world of its own stages x replicas workers, each with
// the budget of the worker it stands for in the planned world (place_stages' order).
PlanRequest checked_as(const Candidate& c, const PlanRequest& request) {
  PlanRequest out = request;
  if (request.worker_budget_mib.empty()) return out;
  out.worker_budget_mib.clear();
  for (int r = 0; r < c.replicas; ++r) {
    for (int k = 0; k < c.stages; ++k) {
      out.worker_budget_mib.push_back(
          request.worker_budget_mib.at(worker_of_copy(k, r, request.workers, c.replicas)));
    }
  }
  out.workers = c.stages * c.replicas;
  return out;
}

// Two epochs of one step each on a fresh local world under the budget: the second step's images
// per second, and every stage's peak over the run.
StepCheck real_steps(const Candidate& c, const PlanCommandSettings& s,
                     const std::vector<std::string>& names) {
  const std::string metrics =
      (std::filesystem::temp_directory_path() / fmt::format("ferry-plan-{}.json", getpid()))
          .string();
  const int64_t batch = c.global_batch();
  std::vector<std::string> command = {
      s.launcher, "--nproc", std::to_string(c.stages * c.replicas + 1), "--", s.master, "train"};
  for (std::string& word : c.arguments(checked_as(c, s.request), names)) {
    command.push_back(std::move(word));
  }
  for (const std::string& word :
       {std::string("--samples"), std::to_string(batch + std::max<int64_t>(1, batch / 4)),
        std::string("--epochs"), std::string("2"), std::string("--metrics-file"), metrics}) {
    command.push_back(word);
  }
  // The job is a world of its own, not a rank of one this process may belong to.
  const core::ChildEnvironment env{{{"FERRY_LOG_LEVEL", "warn"}},
                                   {"RANK", "WORLD_SIZE", "SLURM_PROCID"}};
  const auto start = Clock::now();
  const core::CommandOutput ran = core::run_process(command, env);
  StepCheck out;
  if (ran.status != 0) {
    // A worker that fails as the job stops can change the exit status; the job's own error
    // still says it ran out of memory.
    const std::string where = where_out_of_memory(ran.output);
    out.out_of_memory = ran.status == kExitOutOfMemory || !where.empty();
    out.error = out.out_of_memory ? "out of memory under the budget" + where
                                  : fmt::format("exit {}: {}", ran.status, tail_of(ran.output, 3));
    std::cerr << fmt::format("  {}, batch {}: {}\n", c.describe(), batch, out.error);
    std::filesystem::remove(metrics);
    return out;
  }
  try {
    const RunReport report = read_run_report(metrics);
    if (report.epochs.empty()) throw std::runtime_error("it has no epoch");
    const EpochRecord& timed = report.epochs.back();
    out.images_per_s = timed.images_per_s;
    for (const StageRecord& stage : report.stages) {
      out.peak_mib.push_back(stage.worker_peak_tensor_mib);
    }
    if (timed.batches > 0 && !timed.stage_compute_s.empty()) {
      const auto batches = static_cast<double>(timed.batches);
      out.terms.step_s = timed.train_s / batches;
      out.terms.slowest_stage_s =
          *std::max_element(timed.stage_compute_s.begin(), timed.stage_compute_s.end());
      out.terms.optimizer_s = timed.optimizer_s / batches;
    }
  } catch (const std::exception& e) {
    out.error = fmt::format("its metrics could not be read: {}", e.what());
    std::filesystem::remove(metrics);
    return out;
  }
  std::filesystem::remove(metrics);
  double peak = 0;
  for (double p : out.peak_mib) peak = std::max(peak, p);
  std::cerr << fmt::format(
      "  {}, batch {}: {:.2f} images/s (estimated {:.2f}), largest peak "
      "{:.0f} MiB (estimated {:.0f}); checked in {:.0f} s\n",
      c.describe(), batch, out.images_per_s, c.predicted_images_per_s(), peak,
      c.predicted_largest_peak_mib(), seconds_since(start));
  return out;
}

void check_request(const PlanRequest& r) {
  depth_of(r.model);
  if (!r.worker_budget_mib.empty() &&
      r.worker_budget_mib.size() != static_cast<size_t>(r.workers)) {
    rpc::refuse(fmt::format("--memory-budget-mib: {} budgets, one per worker, for {} workers",
                            r.worker_budget_mib.size(), r.workers));
  }
  if (r.image_size.height % 32 != 0 || r.image_size.width % 32 != 0) {
    rpc::refuse(fmt::format("--image-size {} is not a multiple of 32", r.image_size.text()));
  }
}

std::vector<Candidate> ranked(const CachedCosts& costs, const PlanRequest& request) {
  try {
    return plan_candidates(costs.blocks, costs.machine, request);
  } catch (const NothingFits& e) {
    rpc::refuse(e.what());
  }
}

// The block costs a plan document was made from, where this machine's cache still holds them
// (the same model, sizes, machine and version); none for a plan without its source (an older
// plan) or made elsewhere: the job measures them then.
std::vector<models::BlockCost> cached_costs_of(const nlohmann::json& plan,
                                               const std::string& source) {
  if (!plan.contains("block_costs")) return {};
  const nlohmann::json& where = plan.at("block_costs");
  const nlohmann::json& r = plan.at("request");
  PlanRequest request;
  request.model = r.at("model").get<std::string>();
  request.classes = r.at("classes").get<int64_t>();
  request.image_size = r.at("image_size").get<core::ImageSize>();
  request.batch_size = r.at("batch_size").get<int64_t>();
  request.largest_batch = r.at("largest_batch").get<bool>();
  const std::string dir = where.at("cache_dir").get<std::string>();
  const CostKey key =
      key_of(request, where.at("cores").get<int>(), where.at("cores_per_worker").get<int>());
  std::optional<CachedCosts> cached = load_costs(dir, key);
  if (!cached) return {};
  std::cerr << fmt::format("block costs of {} at {}: from {} (--plan {})\n", request.model,
                           request.image_size.extent(), cost_file(dir, key), source);
  return cached->blocks;
}

// The candidates of `request` whose estimated peaks stay within `limit_mib` (0: the budget): at
// its batch or, where none does there, at the largest smaller batch one does.
std::vector<Candidate> candidates_within(const CachedCosts& costs, const PlanRequest& request,
                                         double limit_mib) {
  if (limit_mib <= 0) return ranked(costs, request);
  PlanRequest limited = request;
  limited.budget_mib = std::min(request.budget_mib > 0 ? request.budget_mib : limit_mib, limit_mib);
  for (double& mib : limited.worker_budget_mib) mib = std::min(mib, limit_mib);
  try {
    return plan_candidates(costs.blocks, costs.machine, limited);
  } catch (const NothingFits& e) {
    if (request.batch_size <= 1) rpc::refuse(e.what());
  }
  limited.largest_batch = true;
  limited.max_batch = request.batch_size - 1;
  std::vector<Candidate> out = ranked(costs, limited);
  std::cerr << fmt::format(
      "--plan auto: within {:.0f} MiB no configuration's estimates fit batch {}; the largest "
      "batch they fit: {}\n",
      limit_mib, request.batch_size, out.front().global_batch());
  return out;
}

}  // namespace

int run_plan(const PlanCommandSettings& s) {
  try {
    check_request(s.request);
    const auto start = Clock::now();
    const int cores = cores_of(s.cores);
    const int cores_per_worker = std::clamp(s.cores_per_worker, 1, cores);
    const CachedCosts costs = costs_for(s.request, s.cache_dir, cores, cores_per_worker);
    const auto searched = Clock::now();
    std::vector<Candidate> candidates = ranked(costs, s.request);
    const double search_s = seconds_since(searched);
    const std::vector<std::string> names = block_names(costs.blocks);
    std::cerr << fmt::format(
        "{} configurations fit {} worker{}{}; searched in {:.2f} s\n", candidates.size(),
        s.request.workers, s.request.workers == 1 ? "" : "s",
        s.request.budget_mib > 0 ? fmt::format(" of {:.0f} MiB", s.request.budget_mib) : "",
        search_s);
    int passed = 0;
    if (s.verify > 0) {
      std::cerr << "checking the best candidates with real steps:\n";
      passed = check_candidates(candidates, {costs.blocks, costs.machine}, s.request,
                                [&](const Candidate& c) { return real_steps(c, s, names); },
                                {s.verify, 2 * s.verify, 4});
    }
    const Candidate& winner = candidates.front();
    std::cerr << "\n" << candidates_table(candidates, static_cast<size_t>(s.rows));
    std::cerr << fmt::format("planned in {:.0f} s\n", seconds_since(start));
    if (s.verify > 0 && passed == 0) {
      std::cerr << fmt::format(
          "ferry-master plan: none of the candidates checked passed its real steps (see above); "
          "the estimates alone are no plan. Try a larger --memory-budget-mib or a smaller "
          "batch{}, or --verify 0 for estimates only\n",
          s.request.largest_batch ? " (--max-batch)" : "");
      return 1;
    }
    const std::string flags = winner.flags(s.request, names);
    if (s.json) {
      nlohmann::ordered_json document = plan_document(s.request, names, candidates, winner);
      document["block_costs"] = costs_source(s.cache_dir, cores, cores_per_worker);
      std::cout << document.dump() << std::endl;
    } else {
      std::cout << fmt::format("\nfastest{}: {}\nferry-master train {}\n",
                               winner.verified() ? " (checked)" : " (estimated)", winner.describe(),
                               flags);
    }
    return 0;
  } catch (const rpc::Error& e) {
    std::cerr << "ferry-master plan: " << e.what() << "\n";
    return 2;
  }
}

nlohmann::ordered_json plan_for_training(const TrainSettings& settings, int workers,
                                         double estimate_limit_mib) {
  PlanRequest request;
  request.model = settings.plan.model;
  request.classes = settings.plan.classes;
  request.image_size = settings.plan.image_size;
  request.optimizer = settings.plan.optimizer;
  request.workers = workers;
  if (settings.memory_budget.per_worker()) {
    // The first workers hold the stages; the spares after them do not enter the plan.
    const std::vector<int64_t>& mib = settings.memory_budget.mib;
    request.worker_budget_mib.assign(mib.begin(),
                                     mib.begin() + std::min<std::ptrdiff_t>(workers, mib.size()));
    request.budget_mib =
        *std::max_element(request.worker_budget_mib.begin(), request.worker_budget_mib.end());
  } else {
    request.budget_mib = static_cast<double>(settings.memory_budget.largest());
  }
  request.batch_size = settings.plan.batch_size;
  check_request(request);
  // The blocks are measured in this process, whose budget is the job's for the master: they
  // are not the job's tensors.
  const int64_t budget = core::tensor_memory_budget();
  core::set_tensor_memory_budget(0);
  CachedCosts costs;
  try {
    costs = costs_for(request, "", cores_of(0), 1);
  } catch (...) {
    core::set_tensor_memory_budget(budget);
    throw;
  }
  core::set_tensor_memory_budget(budget);
  const std::vector<Candidate> candidates = candidates_within(costs, request, estimate_limit_mib);
  const std::vector<std::string> names = block_names(costs.blocks);
  std::cerr << "--plan auto: estimated, not checked with real steps"
            << (estimate_limit_mib > 0
                    ? fmt::format(" (estimated peaks within {:.0f} MiB)", estimate_limit_mib)
                    : std::string())
            << "\n"
            << candidates_table(candidates, 8);
  std::cerr << "ferry-master train " << candidates.front().flags(request, names) << "\n";
  nlohmann::ordered_json document = plan_document(request, names, candidates, candidates.front());
  document["block_costs"] = costs_source("", cores_of(0), 1);
  return document;
}

nlohmann::json read_plan_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) rpc::refuse(fmt::format("--plan {}: cannot read it", path));
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    rpc::refuse(fmt::format("--plan {}: not JSON ({})", path, e.what()));
  }
}

TrainSettings with_plan(const TrainSettings& settings, const nlohmann::json& plan,
                        const std::string& source) {
  TrainSettings s = settings;
  try {
    const nlohmann::json& request = plan.at("request");
    const nlohmann::json& winner = plan.at("winner");
    s.plan.model = request.at("model").get<std::string>();
    s.plan.classes = request.at("classes").get<int64_t>();
    s.plan.image_size = request.at("image_size").get<core::ImageSize>();
    s.plan.optimizer = core::parse_named(
        optimizer_names(), request.at("optimizer").get<std::string>(), "its \"optimizer\"");
    const auto budget = static_cast<int64_t>(request.at("memory_budget_mib").get<double>());
    const std::vector<double> per_worker =
        request.value("worker_memory_budget_mib", std::vector<double>());
    if (!per_worker.empty()) {
      s.memory_budget.mib.clear();
      for (const double mib : per_worker) s.memory_budget.mib.push_back(std::llround(mib));
      // The spares beyond the plan's workers keep the job's own budgets.
      const std::vector<int64_t>& own = settings.memory_budget.mib;
      if (own.size() > per_worker.size()) {
        s.memory_budget.mib.insert(s.memory_budget.mib.end(), own.begin() + per_worker.size(),
                                   own.end());
      }
    } else if (budget > 0) {
      s.memory_budget = MemoryBudget{{budget}};
    }
    s.plan.batch_size = winner.at("batch_size").get<int64_t>();
    s.plan.stages = winner.at("stages").get<int>();
    s.plan.partition = partition_of(winner.at("first_blocks").get<std::vector<std::string>>());
    s.replicas = winner.at("replicas").get<int>();
    s.pipeline = core::parse_named(step_schedule_names(), winner.at("schedule").get<std::string>(),
                                   "its winner's \"schedule\"");
    s.microbatches = winner.at("microbatches").get<int>();
    s.checkpoint_activations = winner.at("recompute").get<bool>();
    s.planned_costs = cached_costs_of(plan, source);
  } catch (const nlohmann::json::exception& e) {
    rpc::refuse(
        fmt::format("--plan {}: not a plan of `ferry-master plan --json` ({})", source, e.what()));
  } catch (const std::invalid_argument& e) {
    rpc::refuse(fmt::format("--plan {}: {}", source, e.what()));
  }
  return s;
}

}  // namespace ferry::trainer
