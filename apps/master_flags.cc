#include "apps/master_flags.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

#include "apps/flag_ranges.h"
#include "ferry/core/image_size.h"
#include "ferry/core/processes.h"
#include "ferry/data/dataset.h"
#include "ferry/trainer/model_tools.h"

namespace ferry::apps {
namespace {

constexpr double kMaxCount = 1 << 20;      // images, batches, steps, micro-batches
constexpr double kMaxWorkers = 4096;       // stages, replicas, spares
constexpr double kMaxMib = 1ll << 40;      // a memory budget
constexpr double kMaxImageSize = 1 << 15;  // pixels a side

// S or H,W, each side a multiple of 32 (the encoder halves it five times) up to kMaxImageSize.
CLI::Validator image_size_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const std::string refused =
            fmt::format("must be S or H,W, each a multiple of 32 from 32 to {}, not \"{}\"",
                        bound_text(kMaxImageSize), text);
        core::ImageSize size;
        try {
          size = core::ImageSize::parse(text);
        } catch (const std::invalid_argument&) {
          return refused;
        }
        for (const std::int64_t side : {size.height, size.width}) {
          if (side < 32 || side > kMaxImageSize || side % 32 != 0) return refused;
        }
        return {};
      },
      "");
}

// `set` takes the size; `shown` is the default --help shows (none if empty).
void add_image_size_flag(CLI::App* cmd, std::function<void(const core::ImageSize&)> set,
                         const std::string& shown, const std::string& what) {
  cmd->add_option_function<std::string>(
         "--image-size", [set](const std::string& text) { set(core::ImageSize::parse(text)); },
         "image height and width: S for S x S, or H,W (multiples of 32)" + what)
      ->type_name("S|H,W")
      ->default_str(shown)
      ->check(image_size_check());
}

void add_resize_flag(CLI::App* cmd, std::function<void(data::Resize)> set,
                     const std::string& what) {
  cmd->add_option_function<std::string>(
         "--resize", [set](const std::string& text) { set(data::parse_resize(text)); },
         "how an image of another shape than --image-size reaches it: pad (scaled to fit, "
         "keeping its aspect, the rest black), crop (scaled to cover, keeping its aspect, its "
         "middle) or stretch" +
             what)
      ->check(one_of({"pad", "crop", "stretch"}));
}

void add_model_flags(CLI::App* cmd, std::string& model, std::int64_t& classes) {
  cmd->add_option("--model", model, "unet-resnet18|34|50|101|152");
  cmd->add_option("--classes", classes,
                  "classes of the masks and output channels of the head: 1 for binary masks (0/1 "
                  "or 0/255), K > 1 for masks of class ids 0 to K-1 (grey levels or a palette's "
                  "indices)")
      ->check(count_up_to(1 << 16));
}

void add_model_flags(CLI::App* cmd, std::string& model, std::int64_t& classes,
                     core::ImageSize& image_size) {
  add_model_flags(cmd, model, classes);
  add_image_size_flag(
      cmd, [&image_size](const core::ImageSize& size) { image_size = size; }, image_size.text(),
      "");
}

void add_ignore_flag(CLI::App* cmd, std::optional<std::int64_t>& ignore_index) {
  cmd->add_option_function<std::int64_t>(
         "--ignore-index", [&ignore_index](const std::int64_t& v) { ignore_index = v; },
         "mask pixels of this value count in no loss and no metric (as VOC's 255 borders)")
      ->check(in_range(0, 65535));
}

void add_batch_flag(CLI::App* cmd, std::int64_t& batch_size, const std::string& what) {
  cmd->add_option("--batch-size", batch_size, what)->check(count_up_to(kMaxCount));
}

void add_optimizer_flag(CLI::App* cmd, trainer::Optimizer& optimizer, const std::string& what) {
  add_choice(cmd, "--optimizer", optimizer, trainer::optimizer_names(), "the optimizer" + what);
}

void add_cut_flags(CLI::App* cmd, trainer::PlanSettings& plan) {
  cmd->add_option("--stages", plan.stages,
                  "cut the U-Net into this many balanced stages (default: its 3 seams)")
      ->check(count_up_to(kMaxWorkers));
  add_choice(cmd, "--balance", plan.balance, trainer::balance_names(),
             "what --stages balances (measured per block)");
  cmd->add_option("--partition", plan.partition,
                  "cut by hand: the first block of each stage after the first, e.g. "
                  "layer3.0,decoder.0 (see describe --blocks)");
}

// One budget for every process, or one per worker; with `zero_is_none`, 0 for none too.
CLI::Validator memory_budget_check(bool zero_is_none) {
  return CLI::Validator(
      [zero_is_none](std::string& text) -> std::string {
        if (zero_is_none && text == "0") return {};
        try {
          trainer::MemoryBudget::parse(text);
          return {};
        } catch (const std::invalid_argument&) {
          return fmt::format(
              "must be MiB from 1 to {}, one for every process or one per worker "
              "(300,160,160){}, not \"{}\"",
              bound_text(kMaxMib), zero_is_none ? " (0: none)" : "", text);
        }
      },
      "");
}

void add_worker_budget_flag(CLI::App* cmd, std::function<void(const trainer::MemoryBudget&)> set,
                            bool zero_is_none, const std::string& what) {
  cmd->add_option_function<std::string>(
         "--memory-budget-mib",
         [set](const std::string& text) {
           set(text == "0" ? trainer::MemoryBudget{} : trainer::MemoryBudget::parse(text));
         },
         what)
      ->type_name("MIB|MIB,MIB,...")
      ->check(memory_budget_check(zero_is_none));
}

void add_budget_flag(CLI::App* cmd, std::int64_t& mib, const std::string& what) {
  cmd->add_option("--memory-budget-mib", mib, what)->check(in_range(1, kMaxMib));
}

void add_secret_flag(CLI::App* cmd, std::string& path, const std::string& what) {
  cmd->add_option("--secret-file", path, what);
}

void add_data_flags(CLI::App* cmd, trainer::TrainSettings& t) {
  add_model_flags(cmd, t.plan.model, t.plan.classes, t.plan.image_size);
  cmd->add_option_function<std::string>(
         "--data", [&t](const std::string& d) { t.data_dir = d == "synthetic" ? "" : d; },
         "synthetic (binary, or a class per kind of shape with --classes 2 to 4), or a folder DIR "
         "with DIR/images/* and DIR/masks/* (PNG, JPEG)")
      ->default_str("synthetic");
  cmd->add_option("--normalize", t.normalize,
                  "images less a mean over a deviation per channel, as pretrained encoders "
                  "expect: imagenet (mean 0.485,0.456,0.406, std 0.229,0.224,0.225), none, or "
                  "M1,M2,M3/S1,S2,S3; checkpoints and exports record it for predict")
      ->capture_default_str();
  cmd->add_option("--augment", t.augment,
                  "what training draws anew for each folder image, image and mask alike: any of "
                  "flip,rot90,scale (a part of a quarter to all of the image, resized),color "
                  "(brightness and contrast), or none")
      ->capture_default_str();
  cmd->add_option("--loader-threads", t.loader_threads,
                  "threads reading and decoding each batch's images, two batches built ahead")
      ->capture_default_str()
      ->check(in_range(1, 256));
  cmd->add_option("--val-data", t.val_data,
                  "a folder to validate on, laid out as --data's (default: the last fifth of "
                  "--data's images)");
  cmd->add_option("--samples", t.samples, "images in the synthetic set")
      ->check(count_up_to(kMaxCount));
  add_resize_flag(
      cmd, [&t](data::Resize resize) { t.resize = resize; }, " (default pad)");
  cmd->add_flag("--crop", t.crop,
                "cut image-size parts out of the folder's images at their own scale (at random "
                "for training) instead of resizing them");
  cmd->add_option("--weights", t.weights,
                  "start from a state dict (torch.save) or TorchScript file: a whole U-Net "
                  "(segmentation_models_pytorch names) or a torchvision ResNet (encoder)");
  cmd->add_option("--epochs", t.epochs, "passes over the training images")
      ->check(count_up_to(kMaxCount));
  add_batch_flag(cmd, t.plan.batch_size, "images per step (per replica)");
  cmd->add_option("--loss", t.loss,
                  "with --classes 1: bce|dice|focal|bce+dice (default bce+dice); with more: "
                  "ce|dice|focal|ce+dice (default ce+dice), as smp's losses; mse with either; or "
                  "a loss a --plugin registers");
  add_ignore_flag(cmd, t.ignore_index);
  cmd->add_option("--class-weights", t.class_weights,
                  "the cross-entropy's weight of each class, W0,W1,... (ce, ce+dice)")
      ->delimiter(',')
      ->check(in_range(0, 1e6));
  cmd->add_option("--class-names", t.class_names,
                  "the classes' names in the metrics, NAME0,NAME1,... (default: DIR/classes.txt, "
                  "a name a line, beside a folder's images; the synthetic set's own)")
      ->delimiter(',');
  add_choice(cmd, "--loss-on", t.loss_on, trainer::loss_placement_names(),
             "where steps compute the loss: last-stage (only its value comes to the master), "
             "master (the logits come to the master) or auto (the last stage in pipelined "
             "steps, the master in plain ones)");
  cmd->add_option("--seed", t.seed, "seed of weights, data and shuffling")
      ->check(in_range(0, static_cast<double>(std::numeric_limits<std::int64_t>::max())));
}

void add_optimization_flags(CLI::App* cmd, trainer::TrainSettings& t) {
  add_optimizer_flag(cmd, t.plan.optimizer, "");
  cmd->add_option("--lr", t.lr, "learning rate")->check(in_range(0, 1e3, true));
  cmd->add_option("--accumulate", t.accumulate,
                  "sum the gradients of this many batches into each optimizer step (as "
                  "Lightning's accumulate_grad_batches)")
      ->check(count_up_to(kMaxCount));
  add_choice(cmd, "--lr-schedule", t.lr_schedule, dist_autograd::LrSchedule::kind_names(),
             "the learning rate per optimizer step (saved in checkpoints; --resume goes on along "
             "the same curve)");
  cmd->add_option("--warmup-steps", t.warmup_steps,
                  "optimizer steps of linear warm-up (-1: none; onecycle: 30% of the run)")
      ->check(in_range(0, kMaxCount * kMaxCount));
  cmd->add_option("--lr-step-size", t.lr_step_size,
                  "step schedule: optimizer steps between drops (0: a third of the run)")
      ->check(count_up_to(kMaxCount * kMaxCount));
  cmd->add_option("--lr-gamma", t.lr_gamma, "step schedule: the factor of each drop")
      ->check(in_range(0, 1, true));
  add_choice(cmd, "--monitor", t.monitor, trainer::monitor_names(),
             "the validation metric that picks the best epoch (not given: val_loss where "
             "--save-best or --early-stop-patience needs one)");
  cmd->add_flag("--save-best", t.save_best,
                "keep the best epoch's checkpoint in CHECKPOINT_DIR/best beside the latest");
  cmd->add_option("--early-stop-patience", t.early_stop_patience,
                  "stop after this many epochs without improvement of --monitor (0: never)")
      ->check(in_range(0, kMaxCount));
  add_choice(cmd, "--precision", t.precision, remote_module::precision_names(),
             "32 (or 32-true), or bf16-mixed: stages compute under bfloat16 autocast and send "
             "bfloat16 activations and gradients; weights stay float32");
  cmd->add_flag("--freeze-batchnorm", t.freeze_batchnorm,
                "keep every batch norm's running statistics and affine parameters as loaded "
                "(for small batches, fine-tuning from pretrained weights)");
  cmd->add_flag("--sync-batchnorm", t.sync_batchnorm,
                "batch norms take their statistics over the whole step: every replica's batch "
                "together, and all micro-batches for the running statistics");
}

void add_parallel_flags(CLI::App* cmd, trainer::TrainSettings& t) {
  cmd->add_option_function<std::string>(
      "--plan",
      [&t](const std::string& plan) {
        t.plan_auto = plan == "auto";
        t.plan_file = t.plan_auto ? "" : plan;
      },
      "auto: plan the stages, replicas, schedule, micro-batches and recomputation for this "
      "world's workers and budget first (--batch-size is then the step's whole batch); or a file "
      "of `ferry-master plan --json` to take them from");
  cmd->add_option("--placement", t.placement,
                  "stage=worker,... (default: one stage per worker in rank order)");
  add_cut_flags(cmd, t.plan);
  cmd->add_option("--replicas", t.replicas,
                  "copies of the staged model on workers of their own, each on --batch-size "
                  "images of every step, gradients averaged across them (data parallel)")
      ->check(count_up_to(kMaxWorkers));
  cmd->add_option("--bucket-mib", t.bucket_mib,
                  "with --replicas: gradients are averaged in buckets of this many MiB, each "
                  "all-reduced as soon as the backward has produced it (as DDP's bucket_cap_mb)")
      ->check(in_range(0, 1 << 16, true));
  cmd->add_flag("--via-master", t.via_master,
                "send activations through the master between stages (naive model parallelism) "
                "instead of from worker to worker");
  add_choice(cmd, "--pipeline", t.pipeline, pipeline::schedule_names(),
             "pipeline the steps: gpipe (all forwards, then all backwards), 1f1b (one forward, "
             "one backward; less activation memory) or zb (1f1b with each backward's weight "
             "gradients deferred to fill the bubble)");
  cmd->add_option("--microbatches", t.microbatches,
                  "micro-batches per batch in a pipelined step (1: the naive schedule)")
      ->check(count_up_to(kMaxCount));
  cmd->add_flag("--checkpoint-activations", t.checkpoint_activations,
                "keep only each stage's inputs and recompute its forward in backward");
  add_choice(cmd, "--rebalance", t.rebalance, trainer::rebalance_names(),
             "pipelined steps: cut the blocks anew from each stage's measured compute and move "
             "them while training when the step gets 5% shorter, first after --rebalance-after "
             "batches, then after epochs out of balance: auto (when --balance time cuts), on or "
             "off");
  cmd->add_option("--rebalance-after", t.rebalance_after,
                  "the first re-balance looks after this many batches of the first epoch (its "
                  "first step warms up and is not measured); below 2, or an epoch that short: "
                  "after the first epoch")
      ->capture_default_str()
      ->check(in_range(0, kMaxCount));
  cmd->add_option("--rebalance-to", t.rebalance_to,
                  "at the first re-balance, move the blocks to this cut, as --partition names it "
                  "(to try a cut, or test a move)");
  cmd->add_option("--trace", t.trace_file,
                  "write a Chrome trace (Perfetto, chrome://tracing) of every stage's forward, "
                  "backward, send, receive and idle time");
  add_worker_budget_flag(
      cmd, [&t](const trainer::MemoryBudget& budget) { t.memory_budget = budget; }, false,
      "each process's tensor memory bound, as a device's; or one per worker in rank order "
      "(workers of unequal memory; the master then has none) (default: FERRY_MEMORY_BUDGET_MIB, "
      "else none)");
}

void add_device_flag(CLI::App* cmd, std::string& device) {
  cmd->add_option("--device", device,
                  "where the other ranks' stages compute, as ferry-worker --device: auto (the "
                  "GPU of each rank's local rank modulo the visible ones; the CPU without one), "
                  "cpu, cuda or cuda:N; --placement WORKER/DEVICE still overrides")
      ->check(device_name());
}

void add_run_flags(CLI::App* cmd, trainer::TrainSettings& t) {
  cmd->add_option("--checkpoint-dir", t.checkpoint_dir, "save after every epoch here");
  cmd->add_option("--checkpoint-every-steps", t.checkpoint_every_steps,
                  "with --checkpoint-dir, save after every N-th optimizer step too (written in "
                  "the background; --resume and spares go on from the batch after it)")
      ->check(in_range(0, 1'000'000'000));
  cmd->add_option("--keep-checkpoints", t.keep_checkpoints,
                  "the newest K checkpoints of --checkpoint-dir stay, older ones are removed")
      ->check(in_range(1, 1'000'000))
      ->capture_default_str();
  cmd->add_flag("--resume", t.resume, "continue from the latest checkpoint");
  cmd->add_option("--events", t.events_file,
                  "write one JSON object a line for every start, optimizer step, checkpoint, lost "
                  "worker, takeover and resume, with its time and step");
  cmd->add_option("--spares", t.spares,
                  "the last K workers hold no stage; when a worker is lost, one of them takes "
                  "over its stages from the last checkpoint and training goes on")
      ->check(in_range(0, kMaxWorkers));
  add_secret_flag(cmd, t.secret_file,
                  "file holding the cluster secret (default: FERRY_SECRET, FERRY_SECRET_FILE); "
                  "every rank needs the same");
  cmd->add_option("--metrics-file", t.metrics_file, "write per-epoch figures as JSON");
  cmd->add_option("--log-dir", t.log_dir,
                  "write DIR/metrics.csv after every epoch (losses, IoU, Dice, learning rate, "
                  "images per second, each stage's busy share) and DIR/metrics.svg, the loss "
                  "and IoU curves");
  cmd->add_option("--plugin", t.plugins,
                  "a shared library of stage types every rank loads (as ferry-worker --plugin); "
                  "repeatable");
  add_device_flag(cmd, t.device);
  cmd->add_flag("--compare-single-process", t.compare_single_process,
                "at the end, measure one step of the whole model in one process");
}

void add_describe(MasterCommandLine& l) {
  l.describe.image_size = 256;
  l.describe_cmd = l.app.add_subcommand(
      "describe", "each stage's blocks, size, output shapes and estimated peak memory and time");
  add_model_flags(l.describe_cmd, l.describe.model, l.describe.classes, l.describe.image_size);
  add_batch_flag(l.describe_cmd, l.describe.batch_size, "images per step, for the estimates");
  add_cut_flags(l.describe_cmd, l.describe);
  add_optimizer_flag(l.describe_cmd, l.describe.optimizer, ", for the estimates");
  l.describe_cmd
      ->add_option("--microbatches", l.describe.microbatches,
                   "micro-batches per batch, for the estimates (blocks are timed at their size)")
      ->capture_default_str()
      ->check(in_range(1, 4096));
  l.describe_cmd
      ->add_option("--threads", l.describe.threads,
                   "intra-op threads each stage will have, for the estimates (0: this "
                   "process's)")
      ->capture_default_str()
      ->check(in_range(0, 1024));
  l.describe_cmd
      ->add_option("--neighbours", l.describe.neighbours,
                   "stages that will compute beside each on its machine, one core each: blocks "
                   "are timed while as many threads run blocks too, with --balance time those of "
                   "the other stages of a first cut (needs --threads 1)")
      ->capture_default_str()
      ->check(in_range(0, 1024));
  l.describe_cmd->add_flag("--blocks", l.blocks, "also every block's measured costs");
  l.describe_cmd->add_flag("--json", l.json, "one JSON object");
}

void add_footprint(MasterCommandLine& l) {
  l.footprint.image_size = 256;
  l.footprint_cmd =
      l.app.add_subcommand("footprint", "peak memory of one training step of the whole model");
  add_model_flags(l.footprint_cmd, l.footprint.model, l.footprint.classes, l.footprint.image_size);
  add_batch_flag(l.footprint_cmd, l.footprint.batch_size, "images per step");
  add_optimizer_flag(l.footprint_cmd, l.footprint.optimizer, "");
  add_budget_flag(l.footprint_cmd, l.footprint_budget_mib,
                  "fail as a device of this many MiB would (default: none)");
}

void add_export(MasterCommandLine& l) {
  trainer::ExportSettings& e = l.export_settings;
  l.export_cmd = l.app.add_subcommand(
      "export",
      "write a checkpoint's whole model as one state dict (torch.save's format, "
      "segmentation_models_pytorch's names)");
  l.export_cmd
      ->add_option("--checkpoint-dir", e.checkpoint_dir, "the training run's --checkpoint-dir")
      ->required();
  l.export_cmd
      ->add_option("--epoch", e.epoch,
                   "the checkpoint of this epoch (kept in the directory or its best/; 0: the "
                   "latest)")
      ->check(in_range(0, kMaxCount));
  l.export_cmd->add_option("--out", e.out, "the file to write (model.pt)")->required();
}

void add_predict(MasterCommandLine& l) {
  trainer::PredictSettings& p = l.predict;
  CLI::App* cmd = l.predict_cmd = l.app.add_subcommand(
      "predict",
      "write a mask for every image of a folder (class ids with --classes K), with IoU and Dice "
      "where it has masks");
  add_model_flags(cmd, p.model, p.classes);
  add_image_size_flag(
      cmd, [&p](const core::ImageSize& size) { p.image_size = size; }, "",
      " (default: as the weights were trained, which checkpoints and exports record)");
  add_resize_flag(
      cmd, [&p](data::Resize resize) { p.resize = resize; },
      " (default: as trained; a crop is predicted padded, so every pixel gets a "
      "class)");
  auto* weights = cmd->add_option("--weights", p.weights,
                                  "weights to use: an exported state dict or any --weights file");
  cmd->add_option("--checkpoint-dir", p.checkpoint_dir,
                  "or a training run's checkpoints (see --epoch)")
      ->excludes(weights);
  cmd->add_option("--epoch", p.epoch, "with --checkpoint-dir: that epoch's (0: the latest)")
      ->check(in_range(0, kMaxCount));
  cmd->add_option("--data", p.data,
                  "DIR/images/* (with DIR/masks/* to score against), or the images in DIR")
      ->required();
  cmd->add_option("--out", p.out, "where the masks go, OUT/NAME.png")->required();
  cmd->add_option("--threshold", p.threshold,
                  "with one class: foreground where the predicted probability is above it")
      ->check(in_range(0, 1));
  add_ignore_flag(cmd, p.ignore_index);
  cmd->add_flag("--overlay", p.overlay,
                "also write OUT/NAME.overlay.png: the image with its mask coloured over it (each "
                "class in Pascal VOC's colour)");
  cmd->add_option("--normalize", p.normalize,
                  "imagenet|none|M1,M2,M3/S1,S2,S3 (default: as the weights were trained, which "
                  "checkpoints and exports record)");
  add_batch_flag(cmd, p.batch_size, "images per forward pass");
  add_secret_flag(cmd, p.secret_file, "file holding the cluster secret, as for train");
  add_device_flag(cmd, p.device);
}

void add_plan(MasterCommandLine& l) {
  trainer::PlanCommandSettings& p = l.plan;
  trainer::PlanRequest& r = p.request;
  CLI::App* cmd = l.plan_cmd = l.app.add_subcommand(
      "plan",
      "the fastest way to train on W workers under a memory budget: stages, replicas, schedule, "
      "micro-batches and recomputation searched from the blocks' measured costs, the best "
      "checked with real steps; prints the winner's train flags");
  add_model_flags(cmd, r.model, r.classes, r.image_size);
  cmd->add_option("--workers", r.workers, "workers to plan for (the master holds no stage)")
      ->check(count_up_to(kMaxWorkers));
  add_worker_budget_flag(
      cmd,
      [&r](const trainer::MemoryBudget& budget) {
        r.budget_mib = static_cast<double>(budget.largest());
        r.worker_budget_mib.clear();
        if (budget.per_worker()) {
          for (const std::int64_t mib : budget.mib) r.worker_budget_mib.push_back(mib);
        }
      },
      true, "each worker's tensor memory, or one per worker in rank order (0: none), as train's");
  auto* batch =
      cmd->add_option("--batch-size", r.batch_size, "images per optimizer step, over all replicas")
          ->check(count_up_to(kMaxCount));
  cmd->add_flag("--largest-batch", r.largest_batch,
                "plan for the largest batch that fits instead of --batch-size")
      ->excludes(batch);
  cmd->add_option("--max-batch", r.max_batch,
                  "with --largest-batch: stop there, and take the fastest configuration that "
                  "trains it")
      ->check(count_up_to(kMaxCount));
  add_optimizer_flag(cmd, r.optimizer, "");
  cmd->add_option("--verify", p.verify,
                  "candidates checked with two real steps on a local world (0: estimates only)")
      ->check(in_range(0, 64));
  cmd->add_option("--cores", p.cores, "the cores the workers share (0: this machine's)")
      ->check(in_range(0, 1 << 16));
  cmd->add_option("--cores-per-worker", p.cores_per_worker,
                  "the most cores one worker computes on (more where each worker has a host of "
                  "its own)")
      ->check(count_up_to(1 << 16));
  cmd->add_option("--cache-dir", p.cache_dir,
                  "where measured block costs are kept (default: FERRY_CACHE_DIR, else "
                  "~/.cache/ferry)");
  cmd->add_option("--rows", p.rows, "rows of the ranked table")->check(count_up_to(kMaxCount));
  cmd->add_flag("--json", p.json,
                "the plan as one JSON object, last on stdout (train --plan FILE)");
}

}  // namespace

std::string flags_a_plan_sets(const MasterCommandLine& l) {
  if (!*l.train_cmd || (!l.train.plan_auto && l.train.plan_file.empty())) return "";
  std::vector<std::string> flags = {"--stages",
                                    "--partition",
                                    "--balance",
                                    "--replicas",
                                    "--pipeline",
                                    "--microbatches",
                                    "--checkpoint-activations"};
  if (!l.train.plan_auto) {
    for (const char* f : {"--model", "--classes", "--image-size", "--optimizer", "--batch-size"}) {
      flags.push_back(f);
    }
  }
  std::string given;
  for (const std::string& f : flags) {
    if (l.train_cmd->count(f) > 0) given += (given.empty() ? "" : ", ") + f;
  }
  return given;
}

MasterCommandLine::MasterCommandLine() {
  app.require_subcommand(1);
  // Sub-commands take this from the app when they are added: every default shows in --help.
  app.option_defaults()->always_capture_default();
  train_cmd = app.add_subcommand("train", "train a U-Net split over the workers");
  add_data_flags(train_cmd, train);
  add_optimization_flags(train_cmd, train);
  add_parallel_flags(train_cmd, train);
  add_run_flags(train_cmd, train);
  add_describe(*this);
  add_footprint(*this);
  add_export(*this);
  add_predict(*this);
  add_plan(*this);
  // The programs the trainer starts are this one and the launcher installed beside it.
  train.master_program = plan.master = core::executable_path();
  plan.launcher = core::executable_dir() + "/ferry-launch";
}

}  // namespace ferry::apps
