// custom-worker: a worker binary of one's own, hosting Ferry's stage functions and, compiled in,
// the "custom.affine" stage type. Rank, world size and master come from the environment.
#include <ferry/pipeline/pipeline.h>
#include <ferry/rpc/rpc.h>

#include <cstdio>

int main() {
  ferry::pipeline::install(ferry::rpc::default_registry());
  try {
    ferry::rpc::init();
  } catch (const ferry::rpc::Error& e) {
    std::fprintf(stderr, "custom-worker: %s\n", e.what());
    return 2;
  }
  ferry::rpc::agent().wait_for_shutdown();
  ferry::rpc::shutdown();
  return 0;
}
