// ferry-launch: runs N copies of a command on this machine as one world, in the manner of
// torchrun (apps/local_launch.h says how).
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "apps/flag_ranges.h"
#include "apps/local_launch.h"

int main(int argc, char** argv) {
  CLI::App app("Ferry launcher: runs N copies of a command as one world on this machine");
  app.option_defaults()->always_capture_default();
  ferry::apps::LaunchSettings s;
  app.add_option("--nproc", s.nproc, "processes to start")->check(ferry::apps::count_up_to(4096));
  app.add_option("--master-port", s.port,
                 "rendezvous port (0: rank 0's store takes one from the system and tells the "
                 "others through a file, FERRY_MASTER_PORT_FILE)")
      ->check(ferry::apps::count_up_to(65535));
  app.add_flag("--tolerate-lost-workers", s.tolerate_lost_workers,
               "a rank other than 0 that dies does not stop the others (ferry-master train "
               "--spares rebuilds its stages)");
  app.add_option("--grace-s", s.grace_s,
                 "when a rank other than 0 dies, how long rank 0 may take to end by itself (and "
                 "explain) before the others are stopped")
      ->check(ferry::apps::in_range(0, 86400));
  app.add_option("command", s.command, "the command, after --")->required();
  CLI11_PARSE(app, argc, argv);
  return ferry::apps::launch_local_world(s);
}
