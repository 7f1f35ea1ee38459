// Stage types from a shared library loaded at run time (`ferry-worker --plugin libmystages.so`):
// its FERRY_REGISTER_STAGE lines register them as it loads, so a stock worker hosts them; its
// FERRY_REGISTER_LOSS lines register losses the same way (loss.h).
//
// A plugin is built against Ferry's headers and LibTorch, without linking Ferry's libraries: the
// Ferry functions it calls (register_stage, ModuleStage, config_int, ...) are the loading
// program's own, which exports them (ferry-worker and ferry-master do; see Ferry::plugin in the
// CMake package). Loading is not thread-safe: load plugins before serving.
#pragma once

#include <string>
#include <vector>

namespace ferry::remote_module {

// Loads the shared library at `path` and returns the stage types it registered. Throws
// rpc::Error(InvalidArgument) naming the file when it is missing, does not load (with dlerror's
// reason), registers a type or loss that exists already, or registers neither.
std::vector<std::string> load_stage_plugin(const std::string& path);

}  // namespace ferry::remote_module
