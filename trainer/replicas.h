// The copies of the staged model that train side by side (--replicas): running a function on
// each at once, and validation with the batches shared among them. Each copy's calls run on a
// thread of their own, so that every copy's autograd context is current where it is used. Used
// from the master's thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ferry/data/dataset.h"
#include "ferry/models/remote_unet.h"
#include "ferry/pipeline/pipeline.h"
#include "ferry/trainer/settings.h"

namespace ferry::trainer {

// One copy of the model: its stages on their workers, and the pipeline over them if pipelined.
struct Replica {
  models::RemoteUnet split;
  std::unique_ptr<pipeline::Pipeline> pipe;
};

// Runs fn(r) for r in [0, count): on this thread for one, else on a thread each, all at once.
// Rethrows the failure of a lost or silent worker (rpc::Error PeerDied or Timeout) before any
// other, since the others often follow from it; else the first.
void for_each_replica(std::size_t count, const std::function<void(std::size_t)>& fn);

// Replica r's share of a batch's `count` images: equal shares, the first ones one larger where
// they do not divide.
at::Tensor share_of(const at::Tensor& batch, std::size_t r, std::size_t count);

struct Validation {
  double loss = 0, iou = 0, dice = 0, miou = 0;
  std::vector<double> class_iou, class_dice;  // each class's (ClassScores)
  // By EpochMonitor's names.
  double of(Monitor metric) const;
};

// Every image of `loader` through the replicas (each batch shared among them, in eval mode and
// without gradients, `piece` images at a time so that a stage holds no more than a training
// micro-batch's forward): the mean loss per image (`loss` a LossSpec's text), and IoU and Dice
// over all pixels, of each class and their means (ClassScores), leaving out pixels of the ignore
// index.
Validation validate(std::vector<Replica>& replicas, data::BatchLoader& loader,
                    const std::string& loss, bool direct, const data::MaskLabels& labels,
                    int64_t piece);

}  // namespace ferry::trainer
