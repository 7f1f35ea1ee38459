#include "trainer/export_weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <vector>

#include "ferry/core/files.h"
#include "ferry/remote_module/checkpoint.h"
#include "ferry/rpc/error.h"

namespace ferry::trainer {
namespace {

namespace fs = std::filesystem;

int epoch_of(const std::string& folder) {
  return static_cast<int>(remote_module::read_checkpoint_value(folder, "epoch").toInt());
}

}  // namespace

std::string checkpoint_of_epoch(const std::string& dir, int epoch) {
  if (epoch <= 0) return remote_module::latest_checkpoint_folder(dir);
  std::vector<std::string> kept;
  for (const std::string& place : {dir, (fs::path(dir) / "best").string()}) {
    std::vector<int> epochs;
    for (const std::string& folder : remote_module::checkpoint_folders(place)) {
      epochs.push_back(epoch_of(folder));
      if (epochs.back() == epoch) return folder;
    }
    if (!epochs.empty()) kept.push_back(fmt::format("{}: {}", place, fmt::join(epochs, ", ")));
  }
  throw rpc::Error(
      rpc::ErrorKind::InvalidArgument,
      fmt::format("no checkpoint of epoch {} in \"{}\" (the epochs kept: {})", epoch, dir,
                  kept.empty() ? "none" : fmt::format("{}", fmt::join(kept, "; "))));
}

std::string smp_model_of(const c10::Dict<std::string, at::Tensor>& state) {
  // ResNets differ in their blocks per layer and in whether a block has a third convolution.
  const std::regex block(R"(encoder\.layer(\d)\.(\d+)\.conv(\d)\.weight)");
  std::set<std::pair<int, int>> blocks;
  bool bottleneck = false;
  for (const auto& item : state) {
    std::smatch m;
    if (!std::regex_match(item.key(), m, block)) continue;
    blocks.insert({std::stoi(m[1]), std::stoi(m[2])});
    bottleneck |= m[3] == "3";
  }
  auto in_layer = [&](int layer) {
    int count = 0;
    for (const auto& b : blocks) count += b.first == layer;
    return count;
  };
  const std::vector<int> layers = {in_layer(1), in_layer(2), in_layer(3), in_layer(4)};
  int depth = 0;
  if (layers == std::vector<int>{2, 2, 2, 2} && !bottleneck) depth = 18;
  if (layers == std::vector<int>{3, 4, 6, 3}) depth = bottleneck ? 50 : 34;
  if (layers == std::vector<int>{3, 4, 23, 3} && bottleneck) depth = 101;
  if (layers == std::vector<int>{3, 8, 36, 3} && bottleneck) depth = 152;
  if (depth == 0 || !state.contains("segmentation_head.0.weight")) return "";
  return fmt::format("smp.Unet(\"resnet{}\", encoder_weights=None, classes={})", depth,
                     state.at("segmentation_head.0.weight").size(0));
}

int export_weights(const ExportSettings& s) {
  if (s.checkpoint_dir.empty() || s.out.empty()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument, "export needs --checkpoint-dir and --out");
  }
  const std::string folder = checkpoint_of_epoch(s.checkpoint_dir, s.epoch);
  const remote_module::SavedCheckpoint checkpoint = remote_module::read_checkpoint(folder);
  const c10::Dict<std::string, at::Tensor> state = remote_module::merged_state(checkpoint);
  remote_module::save_state_dict(state, s.out);
  int64_t parameters = 0;
  for (const auto& item : state) {
    if (item.key().find("running_") == std::string::npos &&
        item.key().find("num_batches_tracked") == std::string::npos) {
      parameters += item.value().numel();
    }
  }
  const std::string model = smp_model_of(state);
  std::cerr << fmt::format(
      "wrote {} tensors ({:.1f} M parameters) of epoch {} ({}) to {}\n", state.size(),
      parameters / 1e6, checkpoint.extra.count("epoch") ? checkpoint.extra.at("epoch").toInt() : 0,
      folder, s.out);
  if (!model.empty()) {
    std::cerr << fmt::format("in Python: model = {}; model.load_state_dict(torch.load(\"{}\"))\n",
                             model, s.out);
  }
  const TrainedInputs inputs = inputs_of(checkpoint, folder);
  nlohmann::ordered_json about = {{"model", model}};
  if (inputs.normalization) {
    const data::Normalization& n = *inputs.normalization;
    about["normalize"] = {{"mean", n.mean}, {"std", n.std}};
    std::cerr << fmt::format("its inputs' normalisation (as trained): mean {}, std {}\n",
                             fmt::join(n.mean, ", "), fmt::join(n.std, ", "));
  }
  if (inputs.image_size) {
    const data::Resize resize = inputs.resize.value_or(data::Resize::pad);
    about["input"] = {{"height", inputs.image_size->height},
                      {"width", inputs.image_size->width},
                      {"resize", data::resize_name(resize)}};
    std::cerr << fmt::format("its input size (as trained): {}, each image brought to it by {}\n",
                             inputs.image_size->extent(), data::resize_name(resize));
  }
  if (inputs.normalization || inputs.image_size) {
    const std::string path = about_path(s.out);
    core::write_file_atomically(path, about.dump(2) + "\n");
    std::cerr << fmt::format("what the model takes, for predict and Python: {}\n", path);
  }
  return 0;
}

std::string about_path(const std::string& weights) {
  return fs::path(weights).replace_extension(".json").string();
}

TrainedInputs inputs_of(const remote_module::SavedCheckpoint& checkpoint,
                        const std::string& folder) {
  TrainedInputs in;
  const auto text = [&](const char* name) -> std::optional<std::string> {
    auto value = checkpoint.extra.find(name);
    if (value == checkpoint.extra.end()) return std::nullopt;
    return value->second.toStringRef();
  };
  try {
    if (auto n = text("normalize")) in.normalization = data::Normalization::parse(*n);
    if (auto size = text("image_size")) in.image_size = core::ImageSize::parse(*size);
    if (auto resize = text("resize")) in.resize = data::parse_resize(*resize);
  } catch (const std::invalid_argument& e) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("checkpoint \"{}\": {}", folder, e.what()));
  }
  return in;
}

TrainedInputs recorded_inputs(const std::string& weights) {
  const std::string path = about_path(weights);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return {};
  TrainedInputs in;
  try {
    const nlohmann::json about = nlohmann::json::parse(core::read_whole_file(path));
    if (about.contains("normalize")) {
      data::Normalization n;
      n.mean = about.at("normalize").at("mean").get<std::array<double, 3>>();
      n.std = about.at("normalize").at("std").get<std::array<double, 3>>();
      in.normalization = n;
    }
    if (about.contains("input")) {
      const nlohmann::json& input = about.at("input");
      in.image_size =
          core::ImageSize(input.at("height").get<int64_t>(), input.at("width").get<int64_t>());
      in.resize = data::parse_resize(input.at("resize").get<std::string>());
    }
  } catch (const std::exception& e) {
    throw rpc::Error(
        rpc::ErrorKind::InvalidArgument,
        fmt::format("\"{}\", beside the weights \"{}\", is not as export writes it: {}", path,
                    weights, e.what()));
  }
  return in;
}

}  // namespace ferry::trainer
