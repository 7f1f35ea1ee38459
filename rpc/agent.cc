// The public face of an Agent: start-up (rendezvous, listening, joining the world) and the calls
// users make. Its parts are in agent_state.h and the agent_*.cc files beside this one.
#include "ferry/rpc/agent.h"

#include <fmt/format.h>
#include <signal.h>

#include <stdexcept>
#include <thread>

#include "ferry/core/environment.h"
#include "ferry/core/log.h"
#include "ferry/core/tensor_cache.h"
#include "rpc/agent_state.h"

namespace ferry::rpc {
namespace {

constexpr auto kSyncSpin = std::chrono::microseconds(200);

}  // namespace

FunctionRegistry& default_registry() {
  static FunctionRegistry registry;
  return registry;
}

std::unique_ptr<Agent> Agent::start(Options options, FunctionRegistry& registry) {
  try {
    core::check_log_level_in_environment();
    core::install_tensor_cache();
  } catch (const std::invalid_argument& e) {
    throw Error(ErrorKind::Init, e.what());
  }
  // libuv writes with plain write(2): a peer that dies mid-write must fail that write, not kill
  // this process with SIGPIPE.
  ::signal(SIGPIPE, SIG_IGN);
  options = resolve_options(std::move(options));
  log::set_worker_name(options.name);
  auto state = std::make_shared<State>(options, registry);
  auto deadline = Clock::now() + options.init_timeout;
  state->self.name = options.name;
  state->self.rank = options.rank;
  // Before the rendezvous, which may wait for the master: a wrong interface is known at once.
  std::string host = choose_listen_host(options.master_addr, options.ifname);
  state->rendezvous = std::make_unique<Rendezvous>(options);
  state->options.master_port = state->rendezvous->port();
  state->pool = std::make_unique<ThreadPool>(options.num_threads);
  state->start_rrefs();
  state->listen(host);
  state->start_loop();
  try {
    state->workers = state->rendezvous->join(state->self, deadline);
  } catch (...) {
    state->stop(false);
    throw;
  }
  for (const auto& w : state->workers) state->rank_by_name[w.name] = w.rank;
  state->set_phase(State::Phase::Running);
  log::debug("joined as {} in a world of {}", state->self.describe(), options.world_size);
  if (options.secret.empty() && options.rank == 0) {
    log::warn(
        "the cluster is open: any process that reaches its ports may join and call "
        "functions; set FERRY_SECRET or --secret-file to require a shared secret");
  }
  return std::unique_ptr<Agent>(new Agent(std::move(state)));
}

Agent::Agent(std::shared_ptr<State> state) : state_(std::move(state)) {}

Agent::~Agent() {
  if (state_) state_->stop(false);
}

const WorkerInfo& Agent::self() const { return state_->self; }
const std::vector<WorkerInfo>& Agent::workers() const { return state_->workers; }
const Options& Agent::options() const { return state_->options; }
int Agent::master_port() const { return state_->options.master_port; }
bool Agent::running() const { return state_->is_running(); }

const WorkerInfo& Agent::worker(const std::string& name) const {
  auto it = state_->rank_by_name.find(name);
  if (it == state_->rank_by_name.end()) throw state_->unknown_worker(name);
  return state_->workers[it->second];
}

FuturePtr Agent::call_async(const std::string& to, const std::string& function,
                            std::vector<c10::IValue> args,
                            std::optional<std::chrono::milliseconds> timeout) {
  return state_->call(to, function, std::move(args), timeout, false);
}

c10::IValue Agent::call_sync(const std::string& to, const std::string& function,
                             std::vector<c10::IValue> args,
                             std::optional<std::chrono::milliseconds> timeout) {
  FuturePtr future = state_->call(to, function, std::move(args), timeout, true);
  // A small call usually answers within tens of microseconds; yielding until then spares the
  // sleep and wake-up that a blocking wait costs, which on virtual machines is most of a round
  // trip. Bounded, so a slow call blocks as usual.
  auto spin_until = Clock::now() + kSyncSpin;
  while (!future->completed() && Clock::now() < spin_until) std::this_thread::yield();
  future->wait();
  return future->value();
}

void Agent::shutdown(bool graceful) { state_->stop(graceful); }

std::uint64_t Agent::bytes_sent() const { return state_->payload_sent.load(); }
std::uint64_t Agent::bytes_received() const { return state_->bytes_read.load(); }

std::vector<std::string> Agent::lost_workers() const {
  std::vector<std::string> out;
  for (int rank : state_->calls.lost_ranks()) out.push_back(state_->workers[rank].name);
  return out;
}

RRefPtr Agent::remote(const std::string& to, const std::string& function,
                      std::vector<c10::IValue> args,
                      std::optional<std::chrono::milliseconds> timeout) {
  return state_->rrefs->remote(state_->rank_of(to, function), function, std::move(args), timeout);
}

std::size_t Agent::owned_rref_count() const { return state_->rrefs->owned_count(); }

void Agent::wait_for_shutdown() {
  for (;;) {
    if (!state_->is_running()) return;
    try {
      if (state_->rendezvous->shutdown_started()) break;
    } catch (const std::exception& e) {
      log::warn("the master's rendezvous store is unreachable ({}); stopping", e.what());
      state_->stop(false);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  state_->stop(true);
}

}  // namespace ferry::rpc
