// Who a worker is and where it listens (value type).
#pragma once

#include <string>

namespace ferry::rpc {

struct WorkerInfo {
  std::string name;
  int rank = -1;
  std::string host;
  int port = 0;

  // "worker \"decoder\" (rank 2, 10.0.0.3:41877)": how errors and logs name a worker.
  std::string describe() const;
};

}  // namespace ferry::rpc
