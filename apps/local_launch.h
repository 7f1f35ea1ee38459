// What ferry-launch does once its flags are read: N copies of a command on this machine as one
// world, in the manner of torchrun. Each gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT (0 without a port given, with FERRY_MASTER_PORT_FILE, where rank 0 writes the port
// its store bound and the others read it); every line it prints comes out prefixed with its rank; SIGINT and SIGTERM are
// passed on; and if one copy dies the others are stopped, saying which one and how (with
// `tolerate_lost_workers`, only if it is rank 0: a master with spares carries on). When a rank
// other than 0 dies, rank 0 first gets `grace_s` seconds to end by itself: it is the one that can
// say what the loss means (which stages were lost, which checkpoint is intact). Runs on the
// calling thread; installs handlers of SIGINT and SIGTERM.
#pragma once

#include <string>
#include <vector>

namespace ferry::apps {

struct LaunchSettings {
  int nproc = 1;
  int port = 0;  // the rendezvous port; 0: rank 0 takes one and writes it to a port file
  std::vector<std::string> command;
  bool tolerate_lost_workers = false;
  double grace_s = 30;
};

// Returns the launcher's exit code: 0 when every rank exited 0; rank 0's code when it failed;
// 128 + the signal passed on; 1 for any other failure, 2 when no port could be had.
int launch_local_world(LaunchSettings settings);

}  // namespace ferry::apps
