// The training job of ferry-master: a U-Net split into stages on workers, trained with
// distributed autograd and a distributed optimizer on a segmentation data set.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "ferry/data/dataset.h"
#include "ferry/dist_autograd/lr_schedule.h"
#include "ferry/models/block_costs.h"
#include "ferry/remote_module/precision.h"
#include "ferry/trainer/settings.h"
#include "ferry/trainer/worker_loop.h"

namespace ferry::trainer {

struct TrainSettings {
  // The model, its input, the batch (per replica), the cut and the optimizer whose state enters
  // the memory estimates (stage_plan.h). Its in_flight_samples is worked out from the schedule.
  PlanSettings plan;
  // Plan the cut, replicas, schedule, micro-batches and recomputation for the world's workers
  // first (plan_command.h), --batch-size being the step's whole batch (`plan_auto`); or take them
  // from a file of `ferry-master plan --json` (`plan_file`); neither: the settings say.
  bool plan_auto = false;
  std::string plan_file;
  // The blocks' costs the plan was made from, taken from the block-cost cache where it holds
  // them (with_plan); empty: the job measures them.
  std::vector<models::BlockCost> planned_costs;
  std::string placement;  // "encoder=worker1,decoder=worker2,head=worker3"; empty: round robin
  // Each rank's tensor memory bound; none: FERRY_MEMORY_BUDGET_MIB's, for every rank.
  MemoryBudget memory_budget;
  std::string data_dir;   // DIR/images/* and DIR/masks/*; empty: the synthetic set
  int64_t samples = 512;  // of the synthetic set
  // How a folder image of another shape than the plan's image size reaches it.
  data::Resize resize = data::Resize::pad;
  bool crop = false;        // folder images: cut image_size out instead of resizing
  std::string weights;      // initial weights file, if set
  bool via_master = false;  // activations through the master instead of stage to stage
  // Pipelined steps under this schedule over `microbatches` micro-batches; none for plain steps
  // (unless microbatches > 1, checkpointing or a trace asks for a pipeline: then GPipe).
  StepSchedule pipeline;
  int microbatches = 1;
  bool checkpoint_activations = false;  // every stage recomputes its forward in backward
  std::string trace_file;               // Chrome trace of the pipelined steps, if set
  // Pipelined steps: cut the blocks anew from what the stages measured, and move blocks between
  // stages while the job runs when that shortens the step by 5% or more (trainer/rebalance.h).
  // Auto: when the cut is balanced by time.
  Rebalance rebalance = Rebalance::Auto;
  // The first look at the stages' compute: after this many batches of the first epoch (the
  // first step, warming up, is not counted), or after the epoch when it has no more; 0: after the
  // first epoch. Later looks follow epochs.
  int rebalance_after = 6;
  // At the first look, move to this cut whatever it gains (the first block of each stage after
  // the first, as --partition takes them); empty: none.
  std::string rebalance_to;
  double validation_share = 0.2;  // of --data's images, its last ones; unless val_data is set
  std::string val_data;           // a folder of its own to validate on, laid out as --data
  // How images are normalised before the model (data::Normalization::parse): "imagenet", as the
  // pretrained encoders expect, "none", or "M1,M2,M3/S1,S2,S3". Checkpoints record it.
  std::string normalize = "imagenet";
  // What training draws anew for each folder image (data::Augmentation::parse): any of
  // flip,rot90,scale,color, or none.
  std::string augment = "flip";
  int loader_threads = 2;  // threads reading each batch's images (data::BatchLoader)
  int epochs = 3;
  double lr = 0.01;
  int accumulate = 1;  // batches whose gradients are summed into one optimizer step
  // Copies of the staged model on workers of their own, each on batch_size images of every step,
  // their gradients averaged (Gloo) so that they stay equal: data parallel beside model parallel.
  int replicas = 1;
  double bucket_mib = 25;  // the replicas' gradient buckets (all-reduced as each fills)
  // The learning rate per optimizer step, with a warm-up (-1: none, or 30% of the run for
  // onecycle).
  dist_autograd::LrSchedule::Kind lr_schedule = dist_autograd::LrSchedule::Kind::Constant;
  int64_t warmup_steps = -1;
  int64_t lr_step_size = 0;  // step: optimizer steps between drops (0: a third of the run)
  double lr_gamma = 0.1;     // step: the factor of each drop
  // The best epoch by a validation metric (none: val_loss where --save-best or
  // --early-stop-patience needs one), its checkpoint in checkpoint_dir/best, and a stop after
  // `early_stop_patience` epochs without improvement.
  std::optional<Monitor> monitor;
  bool save_best = false;
  int early_stop_patience = 0;
  bool freeze_batchnorm = false;  // batch norms keep their statistics and affine parameters
  // Batch norms normalise by the statistics of every replica's batch together, and move their
  // running statistics once per step over all micro-batches (ferry/models/sync_batch_norm.h).
  bool sync_batchnorm = false;
  // BFloat16Mixed: each stage computes under autocast and sends bfloat16 activations and
  // gradients; parameters and optimizer state stay float32 (ferry/remote_module/precision.h).
  remote_module::Precision precision = remote_module::Precision::Float32;
  // A registered loss (ferry/remote_module/loss.h): with one class bce | dice | focal |
  // bce+dice, with more ce | dice | focal | ce+dice; or a plugin's. Empty: bce+dice with one
  // class, ce+dice with more.
  std::string loss;
  // Masks: with plan.classes 1, of 0 and 1 (or 0 and 255); with K > 1, class ids. Pixels of
  // `ignore_index` count in no loss and no metric.
  std::optional<std::int64_t> ignore_index;
  std::vector<double> class_weights;  // the cross-entropy's weight per class; empty: equal
  // The classes' names in the metrics; empty: DIR/classes.txt (a name a line) for a folder, the
  // synthetic set's own, or class0, class1, ...
  std::vector<std::string> class_names;
  // Where steps compute it: the last stage (only the loss value comes to the master; each
  // micro-batch's, in pipelined steps), the master (the logits come here and their gradients go
  // back) or auto: the last stage in pipelined steps, the master in plain ones (where the last
  // stage measured no faster; docs/training.md). --via-master steps always compute it here.
  LossPlacement loss_on = LossPlacement::Auto;
  std::string checkpoint_dir;  // a checkpoint after every epoch (and step, as below) here
  // Also one after every N-th optimizer step (0: only after epochs); --resume goes on from the
  // batch after it.
  int checkpoint_every_steps = 0;
  int keep_checkpoints = 2;  // the newest K of the directory stay
  bool resume = false;
  // One JSON object a line for each start, step, checkpoint, lost worker, takeover and resume.
  std::string events_file;
  int spares = 0;  // the last ranks wait as spares; one takes over the stages of a lost worker
  std::uint64_t seed = 0;
  std::string secret_file;           // the cluster secret; empty: FERRY_SECRET or FERRY_SECRET_FILE
  std::vector<std::string> plugins;  // shared libraries of stage types every rank loads
  std::string device = "auto";       // where the worker ranks' stages compute (serve_as_worker)
  std::string metrics_file;          // the final figures as JSON, if set
  // DIR/metrics.csv (a row per epoch) and DIR/metrics.svg (loss and IoU curves), if set.
  std::string log_dir;
  bool compare_single_process = false;  // also measure the whole model's step in one process
  // The program whose `footprint` sub-command measures that step (ferry-master).
  std::string master_program = "ferry-master";
};

// Runs as rank 0 of the world described by the environment. Returns the exit code; a failure
// (a worker lost, bad settings) is printed as one clear message.
int run_training(const TrainSettings& settings);

}  // namespace ferry::trainer
