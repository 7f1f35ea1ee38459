#include "bench/data_bench.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <optional>

#include "bench/stats.h"
#include "ferry/data/dataset.h"
#include "ferry/models/unet.h"
#include "trainer/stage_plan.h"

namespace ferry::bench {
namespace {

namespace fs = std::filesystem;

// The multi-class synthetic set's images and masks at `size`, as PNG files in `dir`.
void write_folder(const std::string& dir, const DataBenchSettings& s) {
  fs::create_directories(fs::path(dir) / "images");
  fs::create_directories(fs::path(dir) / "masks");
  data::SyntheticDataset set(s.images, s.source_size, 1, s.classes);
  for (int i = 0; i < s.images; ++i) {
    const data::Sample sample = set.get(i);
    at::Tensor rgb = sample.image.mul(255).round().to(at::kByte).permute({1, 2, 0}).contiguous();
    cv::Mat image(s.source_size, s.source_size, CV_8UC3, rgb.data_ptr());
    cv::Mat bgr;
    cv::cvtColor(image, bgr, cv::COLOR_RGB2BGR);
    const std::string name = fmt::format("{:05d}.png", i);
    cv::imwrite((fs::path(dir) / "images" / name).string(), bgr);
    data::write_mask(sample.mask[0], (fs::path(dir) / "masks" / name).string());
  }
}

// Images a second the loader gives with `threads` threads, over `batches` batches.
double loader_rate(const std::shared_ptr<const data::Dataset>& set, int threads,
                   const DataBenchSettings& s, int round) {
  std::vector<std::size_t> indices(set->size());
  std::iota(indices.begin(), indices.end(), 0);
  data::BatchLoader loader(set, indices, s.batch, round, /*drop_last=*/true, threads);
  loader.start_epoch(round);
  int64_t images = 0;
  const double seconds = seconds_of([&] {
    for (int b = 0; b < s.batches; ++b) {
      auto batch = loader.next();
      if (!batch) {
        loader.start_epoch(round + b + 1);
        batch = loader.next();
      }
      images += batch->images.size(0);
    }
  });
  return images / seconds;
}

// Images a second one process's training step (forward, backward, Adam) consumes.
double step_rate(const DataBenchSettings& s) {
  models::Unet net(trainer::depth_of(s.model), s.classes);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
  const at::Tensor images = torch::randn({s.batch, 3, s.crop, s.crop});
  const at::Tensor masks = torch::randint(0, s.classes, {s.batch, s.crop, s.crop});
  auto step = [&] {
    adam.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(images), masks).backward();
    adam.step();
  };
  step();
  std::vector<double> seconds;
  for (int k = 0; k < s.steps; ++k) seconds.push_back(seconds_of(step));
  return s.batch / median(seconds);
}

}  // namespace

int run_data_bench(const DataBenchSettings& s) {
  std::string dir = s.data;
  std::optional<fs::path> temporary;
  if (dir.empty()) {
    temporary = fs::temp_directory_path() / fmt::format("ferry-data-bench-{}", ::getpid());
    dir = temporary->string();
  }
  std::error_code ec;
  if (!fs::is_directory(fs::path(dir) / "images", ec)) {
    write_folder(dir, s);
    std::cerr << fmt::format("wrote {} {} x {} PNGs with masks of {} classes to {}\n", s.images,
                             s.source_size, s.source_size, s.classes, dir);
  }
  data::FolderDataset::Options options;
  options.image_size = s.crop;
  options.crop = true;
  options.augment = data::Augmentation::parse("flip");
  options.labels = {s.classes, std::nullopt};
  const auto set = data::normalized(std::make_shared<data::FolderDataset>(dir, options),
                                    data::Normalization::parse("imagenet"));
  nlohmann::ordered_json loader = nlohmann::ordered_json::array();
  for (int threads = 1; threads <= s.max_threads; threads *= 2) {
    std::vector<double> rates;
    for (int r = 0; r < s.repeats; ++r) rates.push_back(loader_rate(set, threads, s, r));
    loader.push_back({{"threads", threads}, {"images_per_s", median(rates)}});
    std::cerr << fmt::format("loader, {} thread{}: {:.1f} images/s\n", threads,
                             threads == 1 ? "" : "s", median(rates));
  }
  const double consumed = step_rate(s);
  std::cerr << fmt::format("a training step of {} at batch {} of {} x {}: {:.2f} images/s\n",
                           s.model, s.batch, s.crop, s.crop, consumed);
  nlohmann::ordered_json out = {
      {"benchmark", "data"},
      {"data", s.data.empty() ? "written" : s.data},
      {"images", set->size()},
      {"crop", s.crop},
      {"batch", s.batch},
      {"loader", loader},
      {"model", s.model},
      {"step_images_per_s", consumed},
      {"loader_over_step_at_default_threads",
       loader.size() > 1 ? loader[1]["images_per_s"].get<double>() / consumed
                         : loader[0]["images_per_s"].get<double>() / consumed}};
  if (temporary) fs::remove_all(*temporary);
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace ferry::bench
