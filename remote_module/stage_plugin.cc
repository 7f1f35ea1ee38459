#include "ferry/remote_module/stage_plugin.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "ferry/remote_module/loss.h"
#include "ferry/remote_module/stage.h"
#include "ferry/rpc/error.h"

namespace ferry::remote_module {
namespace {

// Where registrations record their failures while a plugin loads; null otherwise.
std::vector<std::string>* load_errors = nullptr;

[[noreturn]] void bad_plugin(const std::string& path, const std::string& what) {
  throw rpc::Error(rpc::ErrorKind::InvalidArgument, fmt::format("plugin \"{}\": {}", path, what));
}

}  // namespace

namespace detail {

namespace {
void register_at_load(const std::function<void()>& registration) {
  if (load_errors == nullptr) {
    registration();
    return;
  }
  try {
    registration();
  } catch (const std::exception& e) {
    load_errors->push_back(e.what());
  }
}
}  // namespace

void register_stage_at_load(const std::string& type, StageFactory factory) {
  register_at_load([&] { register_stage(type, std::move(factory)); });
}

void register_loss_at_load(const std::string& name, LossFunction loss) {
  register_at_load([&] { register_loss(name, std::move(loss)); });
}

}  // namespace detail

std::vector<std::string> load_stage_plugin(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) bad_plugin(path, "no such file");
  const std::vector<std::string> before = registered_stages();
  const std::size_t losses_before = registered_losses().size();
  std::vector<std::string> errors;
  load_errors = &errors;
  // RTLD_GLOBAL: a plugin's stages may be used by code loaded after it (another plugin).
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  load_errors = nullptr;
  if (handle == nullptr) bad_plugin(path, fmt::format("cannot be loaded: {}", ::dlerror()));
  if (!errors.empty()) bad_plugin(path, fmt::format("{}", fmt::join(errors, "; ")));
  std::vector<std::string> added;
  for (const std::string& type : registered_stages()) {
    if (std::find(before.begin(), before.end(), type) == before.end()) added.push_back(type);
  }
  if (added.empty() && registered_losses().size() == losses_before) {
    bad_plugin(path,
               "registers no stage type and no loss (no FERRY_REGISTER_STAGE or "
               "FERRY_REGISTER_LOSS ran as it loaded)");
  }
  return added;
}

}  // namespace ferry::remote_module
