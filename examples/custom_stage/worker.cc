// custom-worker: a worker binary of one's own, serving as ferry-worker does (Ferry's stage
// functions and the U-Net's stages) with, compiled in, the "custom.affine" stage type. Rank, world
// size and master come from the environment.
#include <ferry/rpc/options.h>
#include <ferry/trainer/worker_loop.h>

int main() { return ferry::trainer::serve_as_worker(ferry::rpc::Options{}); }
