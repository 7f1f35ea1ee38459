#include "ferry/rpc/collective_group.h"

#include <fmt/format.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "ferry/rpc/agent.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"
#include "rpc/store_client.h"

namespace ferry::rpc {

const char* to_string(CollectiveBackend backend) {
  return backend == CollectiveBackend::Nccl ? "nccl" : "gloo";
}

bool nccl_built() {
#ifdef USE_C10D_NCCL
  return true;
#else
  return false;
#endif
}

CollectiveBackend collective_backend_for(c10::DeviceType type, bool nccl) {
  return type == c10::DeviceType::CUDA && nccl ? CollectiveBackend::Nccl : CollectiveBackend::Gloo;
}

struct CollectiveGroup::State {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
#ifdef USE_C10D_NCCL
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;
#endif
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors) {
#ifdef USE_C10D_NCCL
    if (nccl) return nccl->allreduce(tensors);
#endif
    return gloo->allreduce(tensors);
  }
};

CollectiveGroup::CollectiveGroup(const std::string& key, int rank, int size,
                                 CollectiveBackend backend)
    : state_(std::make_unique<State>()), key_(key), rank_(rank), size_(size) {
  if (backend == CollectiveBackend::Nccl && !nccl_built()) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("{}: this LibTorch has no NCCL; its groups use Gloo", describe()));
  }
  const Options& options = agent().options();
  try {
    // A connection of its own to the store: the rendezvous keeps its own to itself. It proves
    // the secret, so the addresses Gloo's pairs connect to are members' own.
    auto store = c10::make_intrusive<store::StoreClient>(
        store::ClientSettings{options.master_addr, agent().master_port(), options.rank,
                              fmt::format("{} ({})", options.name, key), options.secret,
                              options.rpc_timeout},
        std::chrono::steady_clock::now() + options.rpc_timeout);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(key, store);
#ifdef USE_C10D_NCCL
    if (backend == CollectiveBackend::Nccl) {
      // NCCL meets its members through the same store; its communicator forms at the first
      // all-reduce, on the device of that all-reduce's tensors.
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = options.rpc_timeout;
      state_->nccl =
          c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, size, nccl_options);
      return;
    }
#endif
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.rpc_timeout);
    // The interface this worker's agent listens on: the one its peers reach it by.
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(self().host));
    gloo_options->threads = 1;
    state_->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, gloo_options);
  } catch (const std::exception& e) {
    throw Error(ErrorKind::Timeout, fmt::format("{} could not form ({}): {}", describe(),
                                                to_string(backend), e.what()));
  }
}

CollectiveGroup::~CollectiveGroup() = default;

struct PendingSum::State {
  c10::intrusive_ptr<c10d::Work> work;
  std::string group;
};

PendingSum::PendingSum(std::unique_ptr<State> state) : state_(std::move(state)) {}
PendingSum::PendingSum(PendingSum&&) noexcept = default;
PendingSum& PendingSum::operator=(PendingSum&&) noexcept = default;
PendingSum::~PendingSum() = default;

void PendingSum::wait() {
  try {
    state_->work->wait();
  } catch (const std::exception& e) {
    throw Error(ErrorKind::RemoteException,
                fmt::format("{}: the all-reduce failed, a member is gone or silent: {}",
                            state_->group, e.what()));
  }
}

std::string CollectiveGroup::describe() const {
  return fmt::format("collective group \"{}\" (member {} of {})", key_, rank_, size_);
}

PendingSum CollectiveGroup::start_sum(const at::Tensor& flat) {
  if (!flat.is_contiguous()) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("{}: an all-reduce needs a contiguous tensor", describe()));
  }
  std::vector<at::Tensor> tensors{flat};
  auto state = std::make_unique<PendingSum::State>();
  state->group = describe();
  try {
    state->work = state_->allreduce(tensors);
  } catch (const std::exception& e) {
    throw Error(ErrorKind::RemoteException,
                fmt::format("{}: the all-reduce could not start: {}", describe(), e.what()));
  }
  return PendingSum(std::move(state));
}

void CollectiveGroup::sum(std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return;
  std::vector<at::Tensor> views;
  for (const at::Tensor& t : tensors) views.push_back(t.reshape({-1}));
  at::Tensor flat = at::cat(views);
  start_sum(flat).wait();
  int64_t offset = 0;
  for (at::Tensor& t : tensors) {
    t = flat.narrow(0, offset, t.numel()).view(t.sizes());
    offset += t.numel();
  }
}

}  // namespace ferry::rpc
