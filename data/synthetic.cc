// The synthetic set: a smooth coloured noise background with fine grain, and one to three shapes
// (rotated ellipses and convex polygons) filled with their own colour and texture. The mask is
// their union. Shapes differ from the background in colour and texture, not only brightness, so
// a model has to learn something, yet a small U-Net learns it in minutes. Its multi-class form
// draws shapes of several kinds, each kind telling itself apart by its outline and its texture
// (dots, stripes, grain), as a user's classes differ in more than one way.
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

#include "ferry/data/dataset.h"

namespace ferry::data {
namespace {

// Smooth noise: coarse random values upsampled, so texture has a scale.
at::Tensor texture(int64_t channels, int64_t size, int64_t cells, at::Generator& gen) {
  at::Tensor coarse = torch::randn({1, channels, cells, cells}, gen);
  return torch::upsample_bilinear2d(coarse, {size, size}, false)[0];
}

at::Tensor ellipse(const at::Tensor& ys, const at::Tensor& xs, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> centre(0.2, 0.8), radius(0.08, 0.25), angle(0, M_PI);
  double cy = centre(rng), cx = centre(rng), a = radius(rng), b = radius(rng), t = angle(rng);
  at::Tensor dy = ys - cy, dx = xs - cx;
  at::Tensor u = dx * std::cos(t) + dy * std::sin(t);
  at::Tensor v = -dx * std::sin(t) + dy * std::cos(t);
  return (u / a).pow(2) + (v / b).pow(2) <= 1.0;
}

// Vertices on a circle in angle order make a convex polygon: inside is left of every edge.
at::Tensor polygon(const at::Tensor& ys, const at::Tensor& xs, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> centre(0.25, 0.75), radius(0.1, 0.25), angle(0, 2 * M_PI);
  std::uniform_int_distribution<int> corners(3, 6);
  double cy = centre(rng), cx = centre(rng), r = radius(rng);
  std::vector<double> angles(corners(rng));
  for (double& a : angles) a = angle(rng);
  std::sort(angles.begin(), angles.end());
  at::Tensor inside = torch::ones_like(ys, torch::kBool);
  for (size_t i = 0; i < angles.size(); ++i) {
    double a0 = angles[i], a1 = angles[(i + 1) % angles.size()];
    double y0 = cy + r * std::sin(a0), x0 = cx + r * std::cos(a0);
    double y1 = cy + r * std::sin(a1), x1 = cx + r * std::cos(a1);
    at::Tensor cross = (x1 - x0) * (ys - y0) - (y1 - y0) * (xs - x0);
    inside = inside & (cross >= 0);
  }
  return inside;
}

// A ring: an ellipse less a smaller one with the same centre.
at::Tensor ring(const at::Tensor& ys, const at::Tensor& xs, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> centre(0.25, 0.75), radius(0.12, 0.25), hole(0.4, 0.6);
  double cy = centre(rng), cx = centre(rng), r = radius(rng), inner = r * hole(rng);
  at::Tensor d2 = (ys - cy).pow(2) + (xs - cx).pow(2);
  return (d2 <= r * r) & (d2 > inner * inner);
}

// Each kind's texture over its own colour: dotted, striped, fine grained.
at::Tensor fill_of(int64_t kind, const at::Tensor& ys, const at::Tensor& xs, int64_t size,
                   at::Generator& gen, std::mt19937_64& rng) {
  at::Tensor colour = torch::rand({3, 1, 1}, gen);
  const double turn = 2 * M_PI * 6;  // six periods across the image
  if (kind == 1)
    return colour + 0.25 * (torch::sin(xs * turn) * torch::sin(ys * turn)).unsqueeze(0);
  if (kind == 2) {
    const double angle = std::uniform_real_distribution<double>(0, M_PI)(rng);
    at::Tensor along = xs * std::cos(angle) + ys * std::sin(angle);
    return colour + 0.25 * torch::sin(along * turn).unsqueeze(0);
  }
  return colour + 0.3 * torch::randn({3, size, size}, gen);
}

// An image's random draws, from its key, and its background: coloured smooth noise with fine
// grain. Both forms of the set start from it.
struct Canvas {
  std::mt19937_64 rng;
  at::Generator gen;
  at::Tensor ys, xs;  // each pixel's centre in [0, 1]
  at::Tensor image;
};

Canvas canvas_of(std::uint64_t key, int64_t s) {
  Canvas c{std::mt19937_64(key), at::detail::createCPUGenerator(key), {}, {}, {}};
  at::Tensor coords = (torch::arange(s, torch::kFloat) + 0.5) / s;
  c.ys = coords.view({s, 1}).expand({s, s});
  c.xs = coords.view({1, s}).expand({s, s});
  at::Tensor base = torch::rand({3, 1, 1}, c.gen) * 0.5 + 0.25;
  c.image = base + 0.15 * texture(3, s, 4, c.gen) + 0.05 * torch::randn({3, s, s}, c.gen);
  return c;
}

}  // namespace

SyntheticDataset::SyntheticDataset(std::size_t count, core::ImageSize image_size,
                                   std::uint64_t seed, int64_t classes)
    : count_(count),
      size_(image_size),
      image_size_(std::max(image_size.height, image_size.width)),
      seed_(seed),
      classes_(classes) {
  if (classes < 1 || classes > 4) {
    throw std::invalid_argument(fmt::format(
        "--classes {}: the synthetic set has 1 class (binary masks) or 2 to 4 (background, "
        "ellipse, polygon, ring)",
        classes));
  }
}

std::vector<std::string> synthetic_class_names(int64_t classes) {
  if (classes <= 1) return {"background", "foreground"};
  const std::vector<std::string> all{"background", "ellipse", "polygon", "ring"};
  return {all.begin(), all.begin() + std::min<int64_t>(classes, 4)};
}

Sample SyntheticDataset::get(std::size_t index) const {
  Sample sample = classes_ == 1 ? get_binary(index) : get_classes(index);
  if (size_.square()) return sample;
  // Drawn on the square of the longer side, its middle cut out.
  const int64_t top = (image_size_ - size_.height) / 2, left = (image_size_ - size_.width) / 2;
  for (at::Tensor* t : {&sample.image, &sample.mask}) {
    *t = t->narrow(1, top, size_.height).narrow(2, left, size_.width).contiguous();
  }
  return sample;
}

Sample SyntheticDataset::get_classes(std::size_t index) const {
  Canvas c = canvas_of(seed_ * 0x9E3779B97F4A7C15ull + index, image_size_);
  at::Tensor mask = torch::zeros({image_size_, image_size_}, torch::kLong);
  std::uniform_int_distribution<int64_t> kinds(1, classes_ - 1), count(1, 3);
  for (int64_t k = count(c.rng); k > 0; --k) {
    const int64_t kind = kinds(c.rng);
    at::Tensor inside = kind == 1   ? ellipse(c.ys, c.xs, c.rng)
                        : kind == 2 ? polygon(c.ys, c.xs, c.rng)
                                    : ring(c.ys, c.xs, c.rng);
    at::Tensor fill = fill_of(kind, c.ys, c.xs, image_size_, c.gen, c.rng);
    c.image = torch::where(inside.unsqueeze(0), fill, c.image);
    mask.masked_fill_(inside, kind);
  }
  return {c.image.clamp(0, 1).contiguous(), mask.unsqueeze(0)};
}

Sample SyntheticDataset::get_binary(std::size_t index) const {
  Canvas c = canvas_of(seed_ * 0x9E3779B97F4A7C15ull + index, image_size_);
  std::uniform_real_distribution<double> unit(0, 1);
  at::Tensor mask = torch::zeros({image_size_, image_size_}, torch::kBool);
  int shapes = 1 + static_cast<int>(unit(c.rng) * 3);
  for (int k = 0; k < shapes; ++k) {
    at::Tensor inside = unit(c.rng) < 0.5 ? ellipse(c.ys, c.xs, c.rng) : polygon(c.ys, c.xs, c.rng);
    at::Tensor colour = torch::rand({3, 1, 1}, c.gen);
    at::Tensor fill = colour + 0.2 * texture(3, image_size_, 16, c.gen);
    c.image = torch::where(inside.unsqueeze(0), fill, c.image);
    mask = mask | inside;
  }
  return {c.image.clamp(0, 1).contiguous(), mask.unsqueeze(0).to(torch::kFloat)};
}

}  // namespace ferry::data
