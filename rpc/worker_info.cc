#include "ferry/rpc/worker_info.h"

#include <fmt/format.h>

namespace ferry::rpc {

std::string WorkerInfo::describe() const {
  return fmt::format("worker \"{}\" (rank {}, {}:{})", name, rank, host, port);
}

}  // namespace ferry::rpc
