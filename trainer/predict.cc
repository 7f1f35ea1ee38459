#include "ferry/trainer/predict.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>

#include "ferry/core/files.h"
#include "ferry/core/log.h"
#include "ferry/data/dataset.h"
#include "ferry/models/remote_unet.h"
#include "ferry/models/unet.h"
#include "ferry/models/weights.h"
#include "ferry/remote_module/checkpoint.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"
#include "ferry/trainer/train.h"
#include "ferry/trainer/worker_loop.h"
#include "trainer/class_scores.h"
#include "trainer/export_weights.h"
#include "trainer/placement.h"
#include "trainer/stage_plan.h"
#include "trainer/train_report.h"

namespace ferry::trainer {
namespace {

namespace fs = std::filesystem;

using Model = std::function<at::Tensor(const at::Tensor&)>;

// The size images are brought to before the model, and how.
struct Frame {
  core::ImageSize size;
  data::Resize resize = data::Resize::pad;
};

// The weights to predict with, where they came from (for messages), and how their training fed
// its images, where that was recorded.
struct Weights {
  c10::Dict<std::string, at::Tensor> state;
  std::string source;
  TrainedInputs inputs;
};

Weights weights_of(const PredictSettings& s) {
  if (s.weights.empty() == s.checkpoint_dir.empty()) {
    rpc::refuse("predict needs either --weights FILE or --checkpoint-dir DIR");
  }
  if (!s.weights.empty()) {
    return {models::read_weights(s.weights), s.weights, recorded_inputs(s.weights)};
  }
  const std::string folder = checkpoint_of_epoch(s.checkpoint_dir, s.epoch);
  const remote_module::SavedCheckpoint checkpoint = remote_module::read_checkpoint(folder);
  return {remote_module::merged_state(checkpoint), folder, inputs_of(checkpoint, folder)};
}

// The flags, else what the weights recorded, else 128 x 128 padded. A model trained on crops
// predicts padded, so that every pixel of an image gets a class.
Frame frame_of(const PredictSettings& s, const Weights& weights) {
  Frame f{s.image_size.value_or(weights.inputs.image_size.value_or(core::ImageSize(128))),
          s.resize.value_or(weights.inputs.resize.value_or(data::Resize::pad))};
  if (f.resize == data::Resize::crop) f.resize = data::Resize::pad;
  return f;
}

// --normalize, else what the weights recorded, else ImageNet's, as training's default.
data::Normalization normalization_of(const PredictSettings& s, const Weights& weights) {
  if (!s.normalize.empty()) {
    try {
      return data::Normalization::parse(s.normalize);
    } catch (const std::invalid_argument& e) {
      rpc::refuse(e.what());
    }
  }
  if (weights.inputs.normalization) return *weights.inputs.normalization;
  log::warn("{} records no normalisation of its inputs: ImageNet's, as training's default",
            weights.source);
  return data::Normalization::parse("imagenet");
}

void check_loaded(const models::LoadReport& report, const Weights& weights,
                  const PredictSettings& s) {
  if (!report.ok()) {
    rpc::refuse(fmt::format("the weights in \"{}\" are not a whole {} with {} class{}: {}",
                            weights.source, s.model, s.classes, s.classes == 1 ? "" : "es",
                            report.describe()));
  }
}

// The images and, where they have one, their masks.
struct Folder {
  std::map<std::string, std::string> images, masks;
};

Folder folder_of(const std::string& dir) {
  Folder f;
  const fs::path images = fs::path(dir) / "images";
  std::error_code ec;
  const bool laid_out = fs::is_directory(images, ec);
  f.images = data::image_files(laid_out ? images.string() : dir);
  if (f.images.empty()) {
    rpc::refuse(
        fmt::format("--data: no PNG or JPEG files in \"{}\"", laid_out ? images.string() : dir));
  }
  const fs::path masks = fs::path(dir) / "masks";
  if (laid_out && fs::is_directory(masks, ec)) f.masks = data::image_files(masks.string());
  return f;
}

// With classes: the overall figures of each class after the images', into OUT/metrics.csv and
// printed.
int report_classes(const ClassScores& scores, std::size_t scored, std::string table,
                   const PredictSettings& s) {
  std::cerr << fmt::format("overall over {} images with masks (all their pixels):\n", scored);
  for (std::size_t k = 0; k < scores.iou.size(); ++k) {
    table += fmt::format("class{},{}\n", k, scores.iou[k]);
    std::cerr << fmt::format("  class {:<4} IoU {:.4f}  Dice {:.4f}\n", k, scores.iou[k],
                             scores.dice[k]);
  }
  table += fmt::format("overall,{}\n", scores.miou);
  const std::string csv = (fs::path(s.out) / "metrics.csv").string();
  core::write_file_atomically(csv, table);
  std::cerr << fmt::format("  mIoU {:.4f}; per image in {}\n", scores.miou, csv);
  return 0;
}

// Every image through `model` in batches; masks written, overlaps reported. Returns the exit code.
int predict_folder(const Model& model, const data::Normalization& normalization, const Frame& frame,
                   const PredictSettings& s) {
  const Folder folder = folder_of(s.data);
  std::error_code ec;
  fs::create_directories(s.out, ec);
  if (ec) rpc::refuse(fmt::format("--out: cannot make \"{}\": {}", s.out, ec.message()));
  std::vector<std::pair<std::string, std::string>> images(folder.images.begin(),
                                                          folder.images.end());
  const std::size_t batches = (images.size() + s.batch_size - 1) / s.batch_size;
  ProgressBar bar("predict", batches);
  std::string table = s.classes > 1 ? "image,miou\n" : "image,iou,dice\n";
  std::vector<std::string> lines;
  Overlap total;
  ClassCounts by_class(s.classes, s.ignore_index);
  std::size_t scored = 0;
  torch::NoGradGuard no_grad;
  for (std::size_t b = 0; b < batches; ++b) {
    const std::size_t first = b * s.batch_size;
    const std::size_t last = std::min(images.size(), first + s.batch_size);
    std::vector<data::ImageFile> files;
    std::vector<at::Tensor> pixels;
    for (std::size_t i = first; i < last; ++i) {
      files.push_back(data::read_image(images[i].second, frame.size, frame.resize));
      pixels.push_back(files.back().pixels);
    }
    const at::Tensor logits = model(normalization.apply(torch::stack(pixels)));
    for (std::size_t i = first; i < last; ++i) {
      const auto& [name, path] = images[i];
      const data::ImageFile& file = files[i - first];
      // The image's part of the frame, back to the image's own size, as its mask is.
      const data::Box& box = file.box;
      at::Tensor part = logits.slice(0, i - first, i - first + 1)
                            .slice(2, box.y, box.y + box.height)
                            .slice(3, box.x, box.x + box.width);
      at::Tensor full = torch::upsample_bilinear2d(part, {file.height, file.width}, false);
      // One class: foreground above the threshold; more: each pixel's likeliest class.
      at::Tensor mask =
          s.classes == 1 ? torch::sigmoid(full[0][0]).gt(s.threshold) : full[0].argmax(0);
      data::write_mask(mask, (fs::path(s.out) / (name + ".png")).string());
      if (s.overlay) {
        data::write_overlay(path, mask, (fs::path(s.out) / (name + ".overlay.png")).string());
      }
      auto truth_file = folder.masks.find(name);
      if (truth_file == folder.masks.end()) continue;
      at::Tensor truth = data::read_mask(truth_file->second, {s.classes, s.ignore_index});
      if (truth.size(0) != file.height || truth.size(1) != file.width) {
        rpc::refuse(fmt::format("mask \"{}\" is {}x{} but its image \"{}\" is {}x{}",
                                truth_file->second, truth.size(1), truth.size(0), path, file.width,
                                file.height));
      }
      if (s.classes > 1) {
        ClassCounts counts(s.classes, s.ignore_index);
        counts.add(full, truth.unsqueeze(0).unsqueeze(0));
        by_class.add(counts);
        ++scored;
        const double miou = counts.scores().miou;
        table += fmt::format("{},{}\n", name, miou);
        lines.push_back(fmt::format("{:<24} mIoU {:.3f}", name, miou));
        continue;
      }
      // Ignored pixels count as neither foreground nor background.
      const at::Tensor keep = s.ignore_index ? truth.ne(static_cast<double>(*s.ignore_index))
                                             : torch::ones_like(truth, torch::kBool);
      const Overlap o = overlap_of(mask.to(at::kFloat) * keep, truth * keep);
      total.add(o);
      ++scored;
      table += fmt::format("{},{},{}\n", name, o.iou(), o.dice());
      lines.push_back(fmt::format("{:<24} IoU {:.3f}  Dice {:.3f}", name, o.iou(), o.dice()));
    }
    bar.update(b + 1, fmt::format("{} images", last));
  }
  std::cerr << fmt::format("{} masks written to {}\n", images.size(), s.out);
  if (scored == 0) return 0;
  for (const std::string& line : lines) std::cerr << line << "\n";
  if (s.classes > 1) return report_classes(by_class.scores(), scored, table, s);
  table += fmt::format("overall,{},{}\n", total.iou(), total.dice());
  core::write_file_atomically((fs::path(s.out) / "metrics.csv").string(), table);
  std::cerr << fmt::format(
      "overall over {} images with masks (all their pixels): IoU {:.4f}, Dice {:.4f}; per image "
      "in {}\n",
      scored, total.iou(), total.dice(), (fs::path(s.out) / "metrics.csv").string());
  return 0;
}

int predict_in_this_process(const PredictSettings& s) {
  const Weights weights = weights_of(s);
  models::Unet net(depth_of(s.model), s.classes);
  check_loaded(models::load_state_dict(*net, weights.state), weights, s);
  net->eval();
  return predict_folder([&](const at::Tensor& images) { return net->forward(images); },
                        normalization_of(s, weights), frame_of(s, weights), s);
}

int predict_on_workers(const PredictSettings& s) {
  const Weights weights = weights_of(s);
  const int workers = static_cast<int>(rpc::workers().size()) - 1;
  PlanSettings p;
  p.model = s.model;
  p.classes = s.classes;
  const Frame frame = frame_of(s, weights);
  p.image_size = frame.size;
  p.batch_size = s.batch_size;
  p.stages = workers == 3 ? 0 : workers;  // three workers: the seams
  const StagePlan plan = plan_stages(p);
  const std::vector<std::string> places = place_stages(plan, "", 0, 1, world_names());
  std::cerr << plan_table(plan, places) << std::flush;
  models::RemoteUnet split = models::RemoteUnet::create(plan.depth, s.classes, plan.on(places));
  check_loaded(split.load_state(weights.state), weights, s);
  split.train(false);
  return predict_folder([&](const at::Tensor& images) { return split.forward(images, true); },
                        normalization_of(s, weights), frame, s);
}

}  // namespace

void Overlap::add(const Overlap& other) {
  intersection += other.intersection;
  predicted += other.predicted;
  truth += other.truth;
}

double Overlap::iou() const {
  const double united = predicted + truth - intersection;
  return united == 0 ? 1.0 : intersection / united;
}

double Overlap::dice() const {
  return predicted + truth == 0 ? 1.0 : 2 * intersection / (predicted + truth);
}

Overlap overlap_of(const at::Tensor& predicted, const at::Tensor& truth) {
  return {(predicted * truth).sum().item<double>(), predicted.sum().item<double>(),
          truth.sum().item<double>()};
}

int run_prediction(const PredictSettings& s) {
  if (s.classes < 1) rpc::refuse(fmt::format("--classes must be 1 or more, not {}", s.classes));
  if (!(s.threshold > 0 && s.threshold < 1)) {
    rpc::refuse(fmt::format("--threshold must be between 0 and 1, not {}", s.threshold));
  }
  if (s.data.empty() || s.out.empty()) rpc::refuse("predict needs --data DIR and --out DIR");
  if (s.batch_size < 1) rpc::refuse("--batch-size must be 1 or more");
  depth_of(s.model);
  if (!rpc::world_in_environment()) return predict_in_this_process(s);

  rpc::Options options;
  options.secret_file = s.secret_file;
  options = rpc::resolve_options(options);
  if (options.world_size == 1) return predict_in_this_process(s);
  if (options.rank != 0) return serve_as_worker(options, s.device);
  return run_as_master(options, "prediction", [&] { return predict_on_workers(s); });
}

}  // namespace ferry::trainer
