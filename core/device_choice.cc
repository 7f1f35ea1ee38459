#include "ferry/core/device_choice.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "ferry/core/environment.h"

namespace ferry::core {
namespace {

// torchrun, srun, mpirun, and MPICH's Hydra.
constexpr const char* kLocalRankVariables[] = {"LOCAL_RANK", "SLURM_LOCALID",
                                               "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"};

std::string visible_devices_said(const std::map<std::string, std::string>& env,
                                 std::int64_t visible) {
  std::string said =
      fmt::format("{} CUDA device{} visible", visible, visible == 1 ? " is" : "s are");
  auto it = env.find("CUDA_VISIBLE_DEVICES");
  if (it != env.end()) said += fmt::format(" (CUDA_VISIBLE_DEVICES={:?})", it->second);
  return said;
}

DeviceChoice by_local_rank(const std::map<std::string, std::string>& env, std::int64_t visible) {
  for (const char* name : kLocalRankVariables) {
    auto it = env.find(name);
    if (it == env.end() || it->second.empty()) continue;
    const std::int64_t rank = parse_whole_number(name, it->second, 0);
    return {fmt::format("cuda:{}", rank % visible),
            fmt::format("{}={} mod {} visible CUDA device{}", name, rank, visible,
                        visible == 1 ? "" : "s")};
  }
  return {"cuda:0",
          "no local rank set (LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK or "
          "MPI_LOCALRANKID)"};
}

}  // namespace

DeviceChoice choose_device(const std::string& requested,
                           const std::map<std::string, std::string>& env, std::int64_t visible) {
  if (requested == "cpu") return {"cpu", "asked for"};
  if (requested == "auto") {
    if (visible <= 0) return {"cpu", visible_devices_said(env, 0)};
    return by_local_rank(env, visible);
  }
  if (requested == "cuda") {
    if (visible <= 0) {
      throw std::invalid_argument(fmt::format("--device cuda: {}", visible_devices_said(env, 0)));
    }
    return by_local_rank(env, visible);
  }
  const std::string prefix = "cuda:";
  if (requested.rfind(prefix, 0) == 0) {
    const std::string digits = requested.substr(prefix.size());
    if (digits.empty() || digits.size() > 6 ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      throw std::invalid_argument(fmt::format(
          "--device {:?}: the device index after \"cuda:\" must be a whole number", requested));
    }
    const std::int64_t index = std::stoll(digits);
    if (index >= visible) {
      throw std::invalid_argument(
          fmt::format("--device {}: {}{}", requested, visible_devices_said(env, visible),
                      visible > 0 ? fmt::format(", cuda:0 to cuda:{}", visible - 1) : ""));
    }
    return {requested, "asked for"};
  }
  throw std::invalid_argument(
      fmt::format("--device {:?} is none of auto, cpu, cuda and cuda:N", requested));
}

}  // namespace ferry::core
