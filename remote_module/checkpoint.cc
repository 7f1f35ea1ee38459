#include "ferry/remote_module/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "ferry/core/files.h"
#include "ferry/remote_module/stage_here.h"
#include "ferry/remote_module/state_handover.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"
#include "remote_module/checkpoint_files.h"
#include "remote_module/installers.h"

namespace ferry::remote_module {
namespace {

namespace fs = std::filesystem;

int checkpoint_number(const fs::path& path) {
  std::string name = path.filename().string();
  if (name.rfind("ckpt-", 0) != 0) return -1;
  try {
    return std::stoi(name.substr(5));
  } catch (const std::exception&) {
    return -1;
  }
}

std::vector<int> existing(const fs::path& dir) {
  std::vector<int> numbers;
  for (const auto& entry : fs::directory_iterator(dir)) {
    int n = checkpoint_number(entry.path());
    if (n >= 0 && entry.is_directory()) numbers.push_back(n);
  }
  std::sort(numbers.begin(), numbers.end());
  return numbers;
}

}  // namespace

CheckpointContent gather_checkpoint(const NamedStages& stages, NamedValues extra) {
  CheckpointContent content;
  for (const auto& [name, module] : stages) {
    if (extra.count(name)) {
      rpc::refuse(fmt::format("checkpoint value \"{}\" has the name of a stage", name));
    }
    c10::Dict<std::string, at::Tensor> state = module.state_dict();
    // A stage of this process hands back its own tensors, which training goes on changing.
    if (module.worker() == rpc::self().name) {
      c10::Dict<std::string, at::Tensor> copies;
      for (const auto& item : state) copies.insert(item.key(), item.value().clone());
      state = std::move(copies);
    }
    content.stages.push_back({name, module.type(), module.worker(), std::move(state)});
  }
  content.extra = std::move(extra);
  return content;
}

std::function<CheckpointContent()> take_checkpoint(
    const NamedStages& stages, NamedValues extra,
    std::map<std::string, std::function<c10::IValue()>> deferred) {
  std::vector<CheckpointContent::Stage> described;
  std::vector<rpc::RRefPtr> copies;
  for (const auto& [name, module] : stages) {
    if (extra.count(name) || deferred.count(name)) {
      rpc::refuse(fmt::format("checkpoint value \"{}\" has the name of a stage", name));
    }
    described.push_back(
        {name, module.type(), module.worker(), c10::Dict<std::string, at::Tensor>()});
    copies.push_back(snapshot_state(module));
  }
  auto where = [](const CheckpointContent::Stage& stage) {
    return fmt::format("stage \"{}\" on worker \"{}\"", stage.name, stage.worker);
  };
  for (std::size_t k = 0; k < copies.size(); ++k) {
    try {
      copies[k]->ready()->wait();
    } catch (const std::exception&) {
      rpc::rethrow_as(std::current_exception(),
                      fmt::format("copying the state of {} failed", where(described[k])));
    }
  }
  // The copies leave their workers as they come here: a second call (the same take saved into
  // two directories) is given what the first brought.
  struct Brought {
    std::mutex mutex;
    std::optional<CheckpointContent> content;
  };
  return [described = std::move(described), copies = std::move(copies), extra = std::move(extra),
          deferred = std::move(deferred), where, brought = std::make_shared<Brought>()]() {
    std::lock_guard<std::mutex> lock(brought->mutex);
    if (brought->content) return *brought->content;
    CheckpointContent content{described, extra};
    std::vector<c10::Dict<std::string, at::Tensor>> states;
    try {
      states = bring_snapshots(copies, [&](std::size_t k) { return where(described[k]); });
    } catch (const std::exception&) {
      rpc::rethrow_as(std::current_exception(), "bringing the stages' state here failed");
    }
    for (std::size_t k = 0; k < copies.size(); ++k) content.stages[k].state = std::move(states[k]);
    for (const auto& [name, fetch] : deferred) content.extra[name] = fetch();
    brought->content = content;
    return content;
  };
}

std::string write_checkpoint(const std::string& dir, const CheckpointContent& content, int keep) {
  fs::path root(dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec)
    rpc::refuse(fmt::format("cannot create checkpoint directory \"{}\": {}", dir, ec.message()));
  std::vector<int> numbers = existing(root);
  int next = numbers.empty() ? 0 : numbers.back() + 1;
  fs::path folder = root / fmt::format("ckpt-{}", next);
  fs::create_directories(folder);

  nlohmann::ordered_json manifest;
  manifest["format"] = "ferry-checkpoint-1";
  manifest["stages"] = nlohmann::ordered_json::array();
  for (const CheckpointContent::Stage& stage : content.stages) {
    nlohmann::ordered_json entry = {
        {"name", stage.name}, {"type", stage.type}, {"worker", stage.worker}};
    entry.update(write_listed(folder, stage.name + ".pt", c10::IValue(stage.state)));
    entry["tensors"] = stage.state.size();
    manifest["stages"].push_back(std::move(entry));
  }
  manifest["extra"] = nlohmann::ordered_json::array();
  for (const auto& [name, value] : content.extra) {
    nlohmann::ordered_json entry = {{"name", name}};
    entry.update(write_listed(folder, name + ".pt", value));
    manifest["extra"].push_back(std::move(entry));
  }
  std::string text = manifest.dump(2);
  write_atomically(folder / "manifest.json", std::vector<char>(text.begin(), text.end()));
  std::string latest = folder.filename().string();
  write_atomically(root / "LATEST", std::vector<char>(latest.begin(), latest.end()));

  // Older folders without a manifest are debris of saves that died; of the complete ones, the
  // newest `keep` stay (this one among them).
  std::vector<int> complete;
  for (int n : numbers) {
    fs::path old = root / fmt::format("ckpt-{}", n);
    if (fs::exists(old / "manifest.json")) {
      complete.push_back(n);
    } else {
      fs::remove_all(old, ec);
    }
  }
  for (size_t i = 0; i + std::max(keep - 1, 0) < complete.size(); ++i) {
    fs::remove_all(root / fmt::format("ckpt-{}", complete[i]), ec);
  }
  return folder.string();
}

std::string save_checkpoint(const std::string& dir, const NamedStages& stages, int keep,
                            const NamedValues& extra) {
  return write_checkpoint(dir, gather_checkpoint(stages, extra), keep);
}

namespace {

nlohmann::json read_manifest(const fs::path& folder) {
  try {
    return nlohmann::json::parse(read_file(folder / "manifest.json"));
  } catch (const nlohmann::json::exception& e) {
    rpc::refuse(fmt::format("\"{}\" is not a checkpoint manifest: {}",
                            (folder / "manifest.json").string(), e.what()));
  }
}

// The newest complete checkpoint of `dir` and its manifest.
std::pair<fs::path, nlohmann::json> latest_checkpoint(const std::string& dir) {
  fs::path folder = latest_checkpoint_folder(dir);
  return {folder, read_manifest(folder)};
}

// A pickled value the manifest lists.
c10::IValue read_value(const fs::path& folder, const nlohmann::json& entry) {
  std::vector<char> bytes = read_listed(folder, entry);
  try {
    return torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    rpc::refuse(fmt::format("\"{}\" cannot be unpickled: {}",
                            (folder / entry.at("file").get<std::string>()).string(),
                            e.what_without_backtrace()));
  }
}

c10::Dict<std::string, at::Tensor> read_state(const fs::path& folder, const nlohmann::json& entry) {
  c10::IValue value = read_value(folder, entry);
  try {
    return value.to<c10::Dict<std::string, at::Tensor>>();
  } catch (const c10::Error& e) {
    rpc::refuse(fmt::format("\"{}\" is not a state dict of tensors: {}",
                            (folder / entry.at("file").get<std::string>()).string(),
                            e.what_without_backtrace()));
  }
}

// `source` says where `state` comes from: "\"DIR/ckpt-3\"", "checkpoint \"DIR/ckpt-3\"".
void restore_stage(const std::string& name, const RemoteModule& module,
                   const c10::Dict<std::string, at::Tensor>& state, const std::string& source) {
  try {
    module.load_state_dict(state);
  } catch (const rpc::Error& e) {
    throw e.restated(fmt::format("restoring stage \"{}\" from {}: {}", name, source, e.what()));
  }
}

NamedValues read_extra(const fs::path& folder, const nlohmann::json& manifest) {
  NamedValues extra;
  if (manifest.contains("extra")) {
    for (const auto& entry : manifest.at("extra")) {
      extra[entry.at("name").get<std::string>()] = read_value(folder, entry);
    }
  }
  return extra;
}

}  // namespace

std::string first_names(const std::vector<std::string>& names) {
  constexpr size_t kShown = 5;
  std::vector<std::string> shown(names.begin(), names.begin() + std::min(names.size(), kShown));
  return fmt::format(
      "{}{}", fmt::join(shown, ", "),
      names.size() > kShown ? fmt::format(" and {} more", names.size() - kShown) : std::string());
}

bool has_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / "LATEST", ec);
}

std::string latest_checkpoint_folder(const std::string& dir) {
  fs::path root(dir);
  if (!has_checkpoint(dir)) {
    rpc::refuse(fmt::format("no checkpoint in \"{}\" (it has no LATEST file)", dir));
  }
  std::vector<char> bytes = read_file(root / "LATEST");
  std::string latest(bytes.begin(), bytes.end());
  // A LATEST edited by hand (to go back to an older checkpoint) usually ends with a newline.
  while (!latest.empty() && std::isspace(static_cast<unsigned char>(latest.back()))) {
    latest.pop_back();
  }
  return (root / latest).string();
}

std::vector<std::string> checkpoint_folders(const std::string& dir) {
  std::vector<std::string> folders;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return folders;
  for (int n : existing(dir)) {
    fs::path folder = fs::path(dir) / fmt::format("ckpt-{}", n);
    if (fs::exists(folder / "manifest.json")) folders.push_back(folder.string());
  }
  return folders;
}

SavedCheckpoint read_checkpoint(const std::string& folder) {
  nlohmann::json manifest = read_manifest(folder);
  SavedCheckpoint out{folder, {}, read_extra(folder, manifest)};
  for (const auto& entry : manifest.at("stages")) {
    out.stages.emplace_back(entry.at("name").get<std::string>(), read_state(folder, entry));
  }
  return out;
}

SavedCheckpoint read_latest_checkpoint(
    const std::string& dir,
    const std::function<void(const std::string& folder, const std::string& why)>& skipped) {
  const std::string latest = latest_checkpoint_folder(dir);
  std::vector<std::string> candidates{latest};
  const std::vector<std::string> folders = checkpoint_folders(dir);
  for (auto it = folders.rbegin(); it != folders.rend(); ++it) {
    if (checkpoint_number(*it) < checkpoint_number(latest)) candidates.push_back(*it);
  }
  std::vector<std::string> reasons;
  for (const std::string& folder : candidates) {
    try {
      return read_checkpoint(folder);
    } catch (const std::exception& e) {
      // A manifest of another shape fails in the JSON reader, not as our own error.
      reasons.push_back(e.what());
      if (skipped) skipped(folder, e.what());
    }
  }
  rpc::refuse(
      fmt::format("no checkpoint in \"{}\" could be read: {}", dir, fmt::join(reasons, "; ")));
}

c10::IValue read_checkpoint_value(const std::string& folder, const std::string& name) {
  nlohmann::json manifest = read_manifest(folder);
  for (const auto& entry : manifest.value("extra", nlohmann::json::array())) {
    if (entry.at("name") == name) return read_value(folder, entry);
  }
  rpc::refuse(fmt::format("checkpoint \"{}\" saved no value \"{}\"", folder, name));
}

c10::Dict<std::string, at::Tensor> merged_state(const SavedCheckpoint& checkpoint) {
  c10::Dict<std::string, at::Tensor> whole;
  std::map<std::string, std::string> stage_of;
  for (const auto& [stage, state] : checkpoint.stages) {
    for (const auto& item : state) {
      auto [it, fresh] = stage_of.emplace(item.key(), stage);
      if (!fresh) {
        rpc::refuse(
            fmt::format("checkpoint \"{}\": stages \"{}\" and \"{}\" both have tensor \"{}\"",
                        checkpoint.folder, it->second, stage, item.key()));
      }
      whole.insert(item.key(), item.value());
    }
  }
  return whole;
}

void save_state_dict(const c10::Dict<std::string, at::Tensor>& state, const std::string& path) {
  write_pickled(path, c10::IValue(state));
}

NamedValues load_checkpoint(const std::string& dir, const NamedStages& stages) {
  auto [folder, manifest] = latest_checkpoint(dir);
  std::map<std::string, nlohmann::json> saved;
  for (const auto& entry : manifest.at("stages")) saved[entry.at("name")] = entry;
  for (const auto& [name, module] : stages) {
    auto it = saved.find(name);
    if (it == saved.end()) {
      std::vector<std::string> names;
      for (const auto& [saved_name, entry] : saved) names.push_back(saved_name);
      rpc::refuse(fmt::format("checkpoint \"{}\" has no stage \"{}\" (it has: {})", folder.string(),
                              name, fmt::join(names, ", ")));
    }
    restore_stage(name, module, read_state(folder, it->second),
                  fmt::format("\"{}\"", folder.string()));
  }
  return read_extra(folder, manifest);
}

void load_state_by_tensor_name(std::map<std::string, at::Tensor> state, const NamedStages& stages,
                               const std::string& source) {
  // Every stage's part is found before any is loaded, so a state that does not fit changes
  // nothing.
  std::vector<c10::Dict<std::string, at::Tensor>> parts;
  for (const auto& [name, module] : stages) {
    c10::Dict<std::string, at::Tensor> part;
    std::vector<std::string> missing;
    for (const auto& item : module.state_dict()) {
      auto it = state.find(item.key());
      if (it == state.end()) {
        missing.push_back(item.key());
        continue;
      }
      part.insert(it->first, it->second);
      state.erase(it);
    }
    if (!missing.empty()) {
      rpc::refuse(fmt::format("{} has no tensor for {} of stage \"{}\"'s: {}", source,
                              missing.size(), name, first_names(missing)));
    }
    parts.push_back(std::move(part));
  }
  if (!state.empty()) {
    std::vector<std::string> left;
    for (const auto& [name, tensor] : state) left.push_back(name);
    rpc::refuse(fmt::format("{} has {} tensors that no stage has: {}", source, left.size(),
                            first_names(left)));
  }
  for (size_t k = 0; k < stages.size(); ++k) {
    restore_stage(stages[k].first, stages[k].second, parts[k], source);
  }
}

NamedValues load_checkpoint_by_tensor_name(const std::string& dir, const NamedStages& stages) {
  auto [folder, manifest] = latest_checkpoint(dir);
  std::map<std::string, at::Tensor> pool;
  for (const auto& entry : manifest.at("stages")) {
    for (const auto& item : read_state(folder, entry)) {
      pool[item.key()] = item.value();
    }
  }
  load_state_by_tensor_name(std::move(pool), stages,
                            fmt::format("checkpoint \"{}\"", folder.string()));
  return read_extra(folder, manifest);
}

}  // namespace ferry::remote_module
