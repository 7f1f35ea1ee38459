// The synthetic set: a smooth coloured noise background with fine grain, and one to three shapes
// (rotated ellipses and convex polygons) filled with their own colour and texture. The mask is
// their union. Shapes differ from the background in colour and texture, not only brightness, so
// a model has to learn something, yet a small U-Net learns it in minutes.
#include <torch/torch.h>

#include <cmath>
#include <random>

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

}  // namespace

SyntheticDataset::SyntheticDataset(std::size_t count, int64_t image_size, std::uint64_t seed)
    : count_(count), image_size_(image_size), seed_(seed) {}

Sample SyntheticDataset::get(std::size_t index) const {
  std::uint64_t key = seed_ * 0x9E3779B97F4A7C15ull + index;
  std::mt19937_64 rng(key);
  at::Generator gen = at::detail::createCPUGenerator(key);
  int64_t s = image_size_;
  at::Tensor coords = (torch::arange(s, torch::kFloat) + 0.5) / s;
  at::Tensor ys = coords.view({s, 1}).expand({s, s});
  at::Tensor xs = coords.view({1, s}).expand({s, s});

  std::uniform_real_distribution<double> unit(0, 1);
  at::Tensor base = torch::rand({3, 1, 1}, gen) * 0.5 + 0.25;
  at::Tensor image = base + 0.15 * texture(3, s, 4, gen) + 0.05 * torch::randn({3, s, s}, gen);
  at::Tensor mask = torch::zeros({s, s}, torch::kBool);
  int shapes = 1 + static_cast<int>(unit(rng) * 3);
  for (int k = 0; k < shapes; ++k) {
    at::Tensor inside = unit(rng) < 0.5 ? ellipse(ys, xs, rng) : polygon(ys, xs, rng);
    at::Tensor colour = torch::rand({3, 1, 1}, gen);
    at::Tensor fill = colour + 0.2 * texture(3, s, 16, gen);
    image = torch::where(inside.unsqueeze(0), fill, image);
    mask = mask | inside;
  }
  return {image.clamp(0, 1).contiguous(), mask.unsqueeze(0).to(torch::kFloat)};
}

}  // namespace ferry::data
