#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <stdexcept>

#include "ferry/core/text.h"
#include "ferry/data/dataset.h"

namespace ferry::data {
namespace {

// The three numbers of "A,B,C", a part of --normalize's `text`.
std::array<double, 3> three_of(const std::string& part, const std::string& text) {
  const std::vector<std::string> numbers = core::split(part, ',');
  std::array<double, 3> out{};
  for (std::size_t k = 0; k < out.size() && numbers.size() == out.size(); ++k) {
    std::size_t used = 0;
    try {
      out[k] = std::stod(numbers[k], &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != numbers[k].size()) break;
    if (k + 1 == out.size()) return out;
  }
  throw std::invalid_argument(
      fmt::format("--normalize \"{}\": not imagenet, none, nor three means and three deviations "
                  "(M1,M2,M3/S1,S2,S3)",
                  text));
}

class NormalizedDataset final : public Dataset {
 public:
  NormalizedDataset(std::shared_ptr<const Dataset> dataset, const Normalization& normalization)
      : dataset_(std::move(dataset)), normalization_(normalization) {}
  std::size_t size() const override { return dataset_->size(); }
  Sample get(std::size_t index) const override {
    Sample s = dataset_->get(index);
    s.image = normalization_.apply(s.image);
    return s;
  }
  Sample get_drawn(std::size_t index, std::uint64_t draw) const override {
    Sample s = dataset_->get_drawn(index, draw);
    s.image = normalization_.apply(s.image);
    return s;
  }

 private:
  std::shared_ptr<const Dataset> dataset_;
  Normalization normalization_;
};

}  // namespace

Normalization Normalization::parse(const std::string& text) {
  if (text == "none") return {};
  if (text == "imagenet") return {{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}};
  const std::size_t slash = text.find('/');
  if (slash == std::string::npos) three_of("", text);  // says what is wrong
  Normalization n{three_of(text.substr(0, slash), text), three_of(text.substr(slash + 1), text)};
  for (double s : n.std) {
    if (!(s > 0)) {
      throw std::invalid_argument(
          fmt::format("--normalize \"{}\": a standard deviation must be above 0, not {}", text, s));
    }
  }
  return n;
}

std::string Normalization::to_string() const {
  return fmt::format("{}/{}", fmt::join(mean, ","), fmt::join(std, ","));
}

at::Tensor Normalization::apply(const at::Tensor& images) const {
  if (*this == Normalization{}) return images;
  const auto options = images.options();
  at::Tensor m = torch::tensor({mean[0], mean[1], mean[2]}, torch::kDouble).to(options);
  at::Tensor s = torch::tensor({std[0], std[1], std[2]}, torch::kDouble).to(options);
  return (images - m.view({3, 1, 1})) / s.view({3, 1, 1});
}

std::shared_ptr<const Dataset> normalized(std::shared_ptr<const Dataset> dataset,
                                          const Normalization& normalization) {
  if (normalization == Normalization{}) return dataset;
  return std::make_shared<NormalizedDataset>(std::move(dataset), normalization);
}

}  // namespace ferry::data
