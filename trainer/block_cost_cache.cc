#include "trainer/block_cost_cache.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ferry/core/files.h"
#include "ferry/core/log.h"
#include "trainer/image_size_json.h"

#ifndef FERRY_VERSION
#error "FERRY_VERSION comes from the project's version in CMakeLists.txt"
#endif

namespace ferry::trainer {
namespace {

nlohmann::ordered_json pass_json(const models::PassCost& p) {
  return {{"fixed_s", p.fixed_s}, {"per_sample_s", p.per_sample_s}};
}

models::PassCost pass_of(const nlohmann::json& j) {
  return {j.at("fixed_s").get<double>(), j.at("per_sample_s").get<double>()};
}

nlohmann::ordered_json block_json(const models::BlockCost& c) {
  return {{"name", c.name},
          {"parameters", c.parameters},
          {"parameter_bytes", c.parameter_bytes},
          {"activation_bytes_per_sample", c.activation_bytes_per_sample},
          {"backward_extra_bytes_per_sample", c.backward_extra_bytes_per_sample},
          {"output_bytes_per_sample", c.output_bytes_per_sample},
          {"carry_bytes_per_sample", c.carry_bytes_per_sample},
          {"largest_parameter_bytes", c.largest_parameter_bytes},
          {"forward", pass_json(c.forward)},
          {"backward", pass_json(c.backward)}};
}

models::BlockCost block_of(const nlohmann::json& j) {
  models::BlockCost c;
  c.name = j.at("name").get<std::string>();
  c.parameters = j.at("parameters").get<int64_t>();
  c.parameter_bytes = j.at("parameter_bytes").get<int64_t>();
  c.activation_bytes_per_sample = j.at("activation_bytes_per_sample").get<double>();
  c.backward_extra_bytes_per_sample = j.at("backward_extra_bytes_per_sample").get<double>();
  c.output_bytes_per_sample = j.at("output_bytes_per_sample").get<double>();
  c.carry_bytes_per_sample = j.at("carry_bytes_per_sample").get<double>();
  c.largest_parameter_bytes = j.at("largest_parameter_bytes").get<int64_t>();
  c.forward = pass_of(j.at("forward"));
  c.backward = pass_of(j.at("backward"));
  return c;
}

nlohmann::ordered_json machine_json(const MachineCosts& m) {
  return {{"cores", m.cores},
          {"cores_per_worker", m.cores_per_worker},
          {"thread_speedup", m.thread_speedup},
          {"link_bytes_per_s", m.link_bytes_per_s},
          {"optimizer_s_per_parameter", m.optimizer_s_per_parameter}};
}

MachineCosts machine_of(const nlohmann::json& j) {
  MachineCosts m;
  m.cores = j.at("cores").get<int>();
  m.cores_per_worker = j.at("cores_per_worker").get<int>();
  m.thread_speedup = j.at("thread_speedup").get<double>();
  m.link_bytes_per_s = j.at("link_bytes_per_s").get<double>();
  m.optimizer_s_per_parameter = j.at("optimizer_s_per_parameter").get<double>();
  return m;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown cpu";
}

}  // namespace

nlohmann::ordered_json CostKey::json() const {
  return {{"model", model},
          {"classes", classes},
          {"image_size", image_size},
          {"samples", samples},
          {"second_samples", second_samples},
          {"threads", threads},
          {"machine", machine},
          {"version", version}};
}

std::string this_machine() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  // oneDNN's kernels, and so the blocks' memory and time, follow the instructions it may use.
  std::string isa;
  for (const char* name : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') {
      isa += fmt::format("; {}={}", name, value);
    }
  }
  return fmt::format("{}; {}; {} cores{}", host, cpu_model(), std::thread::hardware_concurrency(),
                     isa);
}

std::string ferry_version() { return FERRY_VERSION; }

std::string default_cache_dir() {
  if (const char* dir = std::getenv("FERRY_CACHE_DIR"); dir != nullptr && *dir != '\0') return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::string(xdg) + "/ferry";
  }
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr && *home != '\0' ? home : "/tmp") + "/.cache/ferry";
}

std::string cost_file(const std::string& dir, const CostKey& key) {
  return (std::filesystem::path(dir) /
          fmt::format("block-costs-{}-classes{}-{}px.json", key.model, key.classes,
                      key.image_size.square()
                          ? std::to_string(key.image_size.height)
                          : fmt::format("{}x{}", key.image_size.height, key.image_size.width)))
      .string();
}

std::optional<CachedCosts> load_costs(const std::string& dir, const CostKey& key) {
  const std::string path = cost_file(dir, key);
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    const nlohmann::ordered_json saved = nlohmann::ordered_json::parse(in);
    // By value, whatever the order of the key's members in the file.
    if (nlohmann::json(saved.at("key")) != nlohmann::json(key.json())) return std::nullopt;
    CachedCosts out;
    for (const auto& block : saved.at("blocks")) out.blocks.push_back(block_of(block));
    out.machine = machine_of(saved.at("machine"));
    return out;
  } catch (const std::exception& e) {
    log::warn("block costs in {} cannot be read ({}); measuring them again", path, e.what());
    return std::nullopt;
  }
}

void save_costs(const std::string& dir, const CostKey& key, const CachedCosts& costs) {
  nlohmann::ordered_json out;
  out["key"] = key.json();
  out["blocks"] = nlohmann::ordered_json::array();
  for (const auto& block : costs.blocks) out["blocks"].push_back(block_json(block));
  out["machine"] = machine_json(costs.machine);
  try {
    std::filesystem::create_directories(dir);
    core::write_file_atomically(cost_file(dir, key), out.dump(1) + "\n");
  } catch (const std::exception& e) {
    log::warn("block costs not cached in {}: {}", dir, e.what());
  }
}

}  // namespace ferry::trainer
