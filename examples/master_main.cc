// ferry-master: the training job (`train`), a look at a model's stages (`describe`, `footprint`),
// and the trained model out of Ferry (`export`, `predict`). Under a launcher (ferry-launch,
// torchrun, srun) every rank runs the same command: rank 0 is the master, every other rank serves
// as a worker.
#include <CLI/CLI.hpp>

#include "examples/export_weights.h"
#include "examples/model_tools.h"
#include "examples/predict.h"
#include "examples/train.h"
#include "ferry/core/message_of.h"

int main(int argc, char** argv) {
  CLI::App app("Ferry master: trains a model split into stages on workers");
  app.require_subcommand(1);

  ferry::examples::TrainSettings train;
  auto* train_cmd = app.add_subcommand("train", "train a U-Net split over the workers");
  train_cmd->add_option("--model", train.model, "unet-resnet18|34|50|101|152");
  train_cmd->add_option("--placement", train.placement,
                        "stage=worker,... (default: one stage per worker in rank order)");
  train_cmd->add_option("--data", train.data,
                        "synthetic, or a folder DIR with DIR/images/* and DIR/masks/* (PNG, JPEG)");
  train_cmd->add_option("--samples", train.samples, "images in the synthetic set");
  train_cmd->add_flag("--crop", train.crop,
                      "cut image-size squares out of the folder's images (at random for "
                      "training) instead of resizing them");
  train_cmd->add_option("--weights", train.weights,
                        "start from a state dict (torch.save) or TorchScript file: a whole U-Net "
                        "(segmentation_models_pytorch names) or a torchvision ResNet (encoder)");
  train_cmd->add_option("--image-size", train.image_size, "image height and width");
  train_cmd->add_option("--epochs", train.epochs, "passes over the training images");
  train_cmd->add_option("--batch-size", train.batch_size, "images per step");
  train_cmd->add_option("--lr", train.lr, "learning rate");
  train_cmd->add_option("--optimizer", train.optimizer, "sgd|adam|adamw");
  train_cmd
      ->add_option("--replicas", train.replicas,
                   "copies of the staged model on workers of their own, each on --batch-size "
                   "images of every step, gradients averaged across them (data parallel)")
      ->check(CLI::PositiveNumber);
  train_cmd
      ->add_option("--accumulate", train.accumulate,
                   "sum the gradients of this many batches into each optimizer step (as "
                   "Lightning's accumulate_grad_batches)")
      ->check(CLI::PositiveNumber);
  train_cmd->add_option("--lr-schedule", train.lr_schedule,
                        "the learning rate per optimizer step: constant|step|cosine|onecycle "
                        "(saved in checkpoints; --resume goes on along the same curve)");
  train_cmd->add_option("--warmup-steps", train.warmup_steps,
                        "optimizer steps of linear warm-up (onecycle: its rise; default 30%)");
  train_cmd->add_option("--lr-step-size", train.lr_step_size,
                        "step schedule: optimizer steps between drops (default: a third of the "
                        "run)");
  train_cmd->add_option("--lr-gamma", train.lr_gamma, "step schedule: the factor of each drop");
  train_cmd->add_option("--monitor", train.monitor,
                        "the validation metric that picks the best epoch: "
                        "val_loss|val_iou|val_dice (default val_loss)");
  train_cmd->add_flag("--save-best", train.save_best,
                      "keep the best epoch's checkpoint in CHECKPOINT_DIR/best beside the latest");
  train_cmd->add_option("--early-stop-patience", train.early_stop_patience,
                        "stop after this many epochs without improvement of --monitor");
  train_cmd->add_option("--precision", train.precision,
                        "32 (or 32-true), or bf16-mixed: stages compute under bfloat16 autocast "
                        "and send bfloat16 activations and gradients; weights stay float32");
  train_cmd->add_flag("--freeze-batchnorm", train.freeze_batchnorm,
                      "keep every batch norm's running statistics and affine parameters as "
                      "loaded (for small batches, fine-tuning from pretrained weights)");
  train_cmd->add_flag("--sync-batchnorm", train.sync_batchnorm,
                      "batch norms take their statistics over the whole step: every replica's "
                      "batch together, and all micro-batches for the running statistics");
  train_cmd->add_option("--loss", train.loss, "bce|dice|bce+dice");
  train_cmd->add_flag("--via-master", train.via_master,
                      "send activations through the master between stages (naive model "
                      "parallelism) instead of from worker to worker");
  train_cmd->add_option("--pipeline", train.pipeline,
                        "pipeline the steps: gpipe (all forwards, then all backwards) or 1f1b "
                        "(one forward, one backward; less activation memory)");
  train_cmd
      ->add_option("--microbatches", train.microbatches,
                   "micro-batches per batch in a pipelined step (1: the naive schedule)")
      ->check(CLI::PositiveNumber);
  train_cmd->add_flag("--checkpoint-activations", train.checkpoint_activations,
                      "keep only each stage's inputs and recompute its forward in backward");
  train_cmd->add_option("--trace", train.trace_file,
                        "write a Chrome trace (Perfetto, chrome://tracing) of every stage's "
                        "forward, backward, send, receive and idle time");
  train_cmd->add_option("--stages", train.stages,
                        "cut the U-Net into this many balanced stages (default: its 3 seams)");
  train_cmd->add_option("--balance", train.balance,
                        "what --stages balances: memory|time|parameters (measured per block)");
  train_cmd->add_option("--partition", train.partition,
                        "cut by hand: the first block of each stage after the first, e.g. "
                        "layer3.0,decoder.0 (see describe --blocks)");
  train_cmd->add_option("--memory-budget-mib", train.memory_budget_mib,
                        "each process's tensor memory bound, as a device's (default: "
                        "FERRY_MEMORY_BUDGET_MIB, else none)");
  train_cmd->add_option("--classes", train.classes, "output channels of the head");
  train_cmd->add_option("--checkpoint-dir", train.checkpoint_dir, "save after every epoch here");
  train_cmd->add_flag("--resume", train.resume, "continue from the latest checkpoint");
  train_cmd
      ->add_option("--spares", train.spares,
                   "the last K workers hold no stage; when a worker is lost, one of them "
                   "takes over its stages from the last checkpoint and training goes on")
      ->check(CLI::NonNegativeNumber);
  train_cmd->add_option("--seed", train.seed, "seed of weights, data and shuffling");
  train_cmd->add_option("--secret-file", train.secret_file,
                        "file holding the cluster secret (default: FERRY_SECRET, "
                        "FERRY_SECRET_FILE); every rank needs the same");
  train_cmd->add_option("--metrics-file", train.metrics_file, "write per-epoch figures as JSON");
  train_cmd->add_option("--log-dir", train.log_dir,
                        "write DIR/metrics.csv after every epoch (losses, IoU, Dice, learning "
                        "rate, images per second, each stage's busy share) and DIR/metrics.svg, "
                        "the loss and IoU curves");
  train_cmd->add_option("--plugin", train.plugins,
                        "a shared library of stage types every rank loads (as ferry-worker "
                        "--plugin); repeatable");
  train_cmd->add_flag("--compare-single-process", train.compare_single_process,
                      "at the end, measure one step of the whole model in one process");

  ferry::examples::PlanSettings plan;
  plan.image_size = 256;
  bool json = false, blocks = false;
  auto* describe_cmd = app.add_subcommand(
      "describe", "each stage's blocks, size, output shapes and estimated peak memory and time");
  describe_cmd->add_option("--model", plan.model, "unet-resnet18|34|50|101|152");
  describe_cmd->add_option("--classes", plan.classes, "output channels of the head");
  describe_cmd->add_option("--image-size", plan.image_size, "input height and width");
  describe_cmd->add_option("--batch-size", plan.batch_size, "images per step, for the estimates");
  describe_cmd->add_option("--stages", plan.stages, "balanced stages (default: the 3 seams)");
  describe_cmd->add_option("--balance", plan.balance, "memory|time|parameters");
  describe_cmd->add_option("--partition", plan.partition,
                           "the first block of each stage after the first");
  describe_cmd->add_option("--optimizer", plan.optimizer, "sgd|adam|adamw, for the estimates");
  describe_cmd->add_flag("--blocks", blocks, "also every block's measured costs");
  describe_cmd->add_flag("--json", json, "one JSON object");
  std::string model = "unet-resnet34";
  int64_t classes = 1, image_size = 256, batch_size = 8;
  auto* footprint_cmd =
      app.add_subcommand("footprint", "peak memory of one training step of the whole model");
  footprint_cmd->add_option("--model", model, "unet-resnet18|34|50|101|152");
  footprint_cmd->add_option("--classes", classes, "output channels of the head");
  footprint_cmd->add_option("--image-size", image_size, "input height and width");
  footprint_cmd->add_option("--batch-size", batch_size, "images per step");
  std::string optimizer = "adam";
  footprint_cmd->add_option("--optimizer", optimizer, "sgd|adam|adamw");
  int64_t footprint_budget_mib = 0;
  footprint_cmd->add_option("--memory-budget-mib", footprint_budget_mib,
                            "fail as a device of this many MiB would");

  ferry::examples::ExportSettings export_settings;
  auto* export_cmd =
      app.add_subcommand("export",
                         "write a checkpoint's whole model as one state dict (torch.save's format, "
                         "segmentation_models_pytorch's names)");
  export_cmd
      ->add_option("--checkpoint-dir", export_settings.checkpoint_dir,
                   "the training run's --checkpoint-dir")
      ->required();
  export_cmd->add_option("--epoch", export_settings.epoch,
                         "the checkpoint of this epoch (kept in the directory or its best/; "
                         "default: the latest)");
  export_cmd->add_option("--out", export_settings.out, "the file to write (model.pt)")->required();

  ferry::examples::PredictSettings predict;
  auto* predict_cmd = app.add_subcommand(
      "predict", "write a mask for every image of a folder, with IoU and Dice where it has masks");
  predict_cmd->add_option("--model", predict.model, "unet-resnet18|34|50|101|152");
  auto* weights_opt = predict_cmd->add_option(
      "--weights", predict.weights, "weights to use: an exported state dict or any --weights file");
  predict_cmd
      ->add_option("--checkpoint-dir", predict.checkpoint_dir,
                   "or a training run's checkpoints (see --epoch)")
      ->excludes(weights_opt);
  predict_cmd->add_option("--epoch", predict.epoch, "with --checkpoint-dir: that epoch's");
  predict_cmd
      ->add_option("--data", predict.data,
                   "DIR/images/* (with DIR/masks/* to score against), or the images in DIR")
      ->required();
  predict_cmd->add_option("--out", predict.out, "where the masks go, OUT/NAME.png")->required();
  predict_cmd->add_option("--threshold", predict.threshold,
                          "foreground where the predicted probability is above it");
  predict_cmd->add_option("--image-size", predict.image_size,
                          "the size the model was trained at; each image is resized to it and "
                          "its mask back to the image's size");
  predict_cmd->add_option("--batch-size", predict.batch_size, "images per forward pass");
  predict_cmd->add_option("--secret-file", predict.secret_file,
                          "file holding the cluster secret, as for train");
  CLI11_PARSE(app, argc, argv);

  try {
    if (*train_cmd) return ferry::examples::run_training(train);
    if (*export_cmd) return ferry::examples::export_weights(export_settings);
    if (*predict_cmd) return ferry::examples::run_prediction(predict);
    if (*footprint_cmd) {
      return ferry::examples::measure_single_process(model, classes, image_size, batch_size,
                                                     optimizer, footprint_budget_mib);
    }
    return ferry::examples::describe_model(plan, json, blocks);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-master: %s\n", ferry::core::message_of(e).c_str());
    return 2;
  }
}
