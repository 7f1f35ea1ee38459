// ferry-master's command line parsed in-process: every numeric flag of every sub-command refuses a
// value that means nothing with one line naming the flag, takes those that do, and --help shows
// every default.
#include "apps/master_flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ferry::apps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// What parsing `args` (after "ferry-master") throws, or "" if it parses.
std::string parse_error(const std::vector<std::string>& args, MasterCommandLine& line) {
  std::vector<const char*> argv{"ferry-master"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  try {
    line.app.parse(static_cast<int>(argv.size()), argv.data());
    return "";
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
}

std::string parse_error(const std::vector<std::string>& args) {
  MasterCommandLine line;
  return parse_error(args, line);
}

struct NumericFlag {
  const char* command;
  const char* flag;
  bool zero_means_something;  // 0 is a setting of its own (none, the latest, never)
};

// The sub-commands' required flags, so that only the flag under test can be wrong.
std::vector<std::string> command_line(const NumericFlag& f, const std::string& value) {
  std::vector<std::string> args{f.command};
  if (std::string(f.command) == "export")
    args.insert(args.end(), {"--checkpoint-dir", "c", "--out", "o"});
  if (std::string(f.command) == "predict") args.insert(args.end(), {"--data", "d", "--out", "o"});
  args.push_back(std::string(f.flag) + "=" + value);
  return args;
}

const std::vector<NumericFlag> kNumericFlags = {
    {"train", "--samples", false},
    {"train", "--epochs", false},
    {"train", "--batch-size", false},
    {"train", "--image-size", false},
    {"train", "--classes", false},
    {"train", "--seed", true},
    {"train", "--lr", false},
    {"train", "--accumulate", false},
    {"train", "--warmup-steps", true},
    {"train", "--lr-step-size", false},
    {"train", "--lr-gamma", false},
    {"train", "--early-stop-patience", true},
    {"train", "--stages", false},
    {"train", "--replicas", false},
    {"train", "--bucket-mib", false},
    {"train", "--microbatches", false},
    {"train", "--memory-budget-mib", false},
    {"train", "--spares", true},
    {"describe", "--image-size", false},
    {"describe", "--classes", false},
    {"describe", "--batch-size", false},
    {"describe", "--stages", false},
    {"footprint", "--image-size", false},
    {"footprint", "--classes", false},
    {"footprint", "--batch-size", false},
    {"footprint", "--memory-budget-mib", false},
    {"export", "--epoch", true},
    {"predict", "--image-size", false},
    {"predict", "--classes", false},
    {"predict", "--batch-size", false},
    {"predict", "--epoch", true},
    {"predict", "--threshold", true},
};

TEST(MasterFlags, EveryNumericFlagRefusesANegativeAHugeAndAMeaninglessZeroInOneLineNamingIt) {
  for (const NumericFlag& f : kNumericFlags) {
    std::vector<std::string> values{"-1", "1e30", "99999999999999999999"};
    if (!f.zero_means_something) values.push_back("0");
    for (const std::string& value : values) {
      const std::string error = parse_error(command_line(f, value));
      SCOPED_TRACE(std::string(f.command) + " " + f.flag + "=" + value);
      EXPECT_THAT(error, HasSubstr(std::string(f.flag) + ": must be "));
      EXPECT_THAT(error, HasSubstr(value));
      EXPECT_THAT(error, Not(HasSubstr("\n")));
    }
    if (f.zero_means_something) {
      EXPECT_EQ(parse_error(command_line(f, "0")), "") << f.command << " " << f.flag;
    }
  }
}

TEST(MasterFlags, AValueThatIsNoNumberIsRefusedNamingTheFlag) {
  EXPECT_THAT(parse_error({"train", "--epochs=three"}), HasSubstr("--epochs"));
  EXPECT_THAT(parse_error({"train", "--lr=fast"}), HasSubstr("--lr"));
}

TEST(MasterFlags, ZeroStagesIsRefusedInsteadOfMeaningTheSeams) {
  EXPECT_EQ(parse_error({"train", "--stages=0"}), "--stages: must be at least 1, not 0");
  EXPECT_EQ(parse_error({"train", "--accumulate=0"}), "--accumulate: must be at least 1, not 0");
  EXPECT_EQ(parse_error({"train", "--lr=0"}), "--lr: must be above 0, not 0");
}

// A word a setting does not know is refused as the flags are read, before any process or stage
// starts, with every word it knows.
TEST(MasterFlags, AnUnknownWordIsRefusedListingTheKnownOnes) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"train", "--pipeline", "foo"}, "--pipeline: must be gpipe, 1f1b or zb, not \"foo\""},
      {{"train", "--optimizer", "foo"}, "--optimizer: must be sgd, adam or adamw, not \"foo\""},
      {{"plan", "--optimizer", "foo"}, "--optimizer: must be sgd, adam or adamw, not \"foo\""},
      {{"train", "--balance", "foo"}, "--balance: must be memory, time or parameters, not \"foo\""},
      {{"describe", "--balance", "foo"},
       "--balance: must be memory, time or parameters, not \"foo\""},
      {{"train", "--precision", "16-mixed"},
       "--precision: must be 32, 32-true or bf16-mixed, not \"16-mixed\""},
      {{"train", "--lr-schedule", "linear"},
       "--lr-schedule: must be constant, step, cosine or onecycle, not \"linear\""},
      {{"train", "--monitor", "val_acc"},
       "--monitor: must be val_loss, val_iou, val_dice or val_miou, not \"val_acc\""},
      {{"train", "--loss-on", "worker"},
       "--loss-on: must be auto, last-stage or master, not \"worker\""},
      {{"train", "--rebalance", "maybe"}, "--rebalance: must be auto, on or off, not \"maybe\""},
      {{"train", "--resize", "squash"}, "--resize: must be pad, crop or stretch, not \"squash\""},
  };
  for (const auto& [args, message] : cases) EXPECT_EQ(parse_error(args), message);
  MasterCommandLine line;
  ASSERT_EQ(
      parse_error({"train", "--pipeline", "zb", "--precision", "32-true", "--monitor", "val_dice",
                   "--loss-on", "master", "--rebalance", "off", "--lr-schedule", "onecycle"},
                  line),
      "");
  EXPECT_EQ(line.train.pipeline, pipeline::Schedule::ZeroBubble);
  EXPECT_EQ(line.train.precision, remote_module::Precision::Float32);
  EXPECT_EQ(line.train.monitor, trainer::Monitor::ValDice);
  EXPECT_EQ(line.train.loss_on, trainer::LossPlacement::Master);
  EXPECT_EQ(line.train.rebalance, trainer::Rebalance::Off);
  EXPECT_EQ(line.train.lr_schedule, dist_autograd::LrSchedule::Kind::OneCycle);
  MasterCommandLine plain;
  ASSERT_EQ(parse_error({"train"}, plain), "");
  EXPECT_FALSE(plain.train.pipeline.has_value());
  EXPECT_FALSE(plain.train.monitor.has_value());
}

TEST(MasterFlags, AnImageSizeIsASideOrTheHeightAndWidthEachAMultipleOf32) {
  MasterCommandLine line;
  ASSERT_EQ(parse_error({"train", "--image-size", "192,256", "--resize", "crop"}, line), "");
  EXPECT_EQ(line.train.plan.image_size, core::ImageSize(192, 256));
  EXPECT_EQ(line.train.resize, data::Resize::crop);
  MasterCommandLine predict;
  ASSERT_EQ(parse_error({"predict", "--data", "d", "--out", "o", "--weights", "w"}, predict), "");
  EXPECT_FALSE(predict.predict.image_size.has_value());  // as the weights were trained
  EXPECT_FALSE(predict.predict.resize.has_value());
  for (const char* bad : {"64,48", "64,64,64", "64x64", ",64"}) {
    EXPECT_THAT(parse_error({"train", "--image-size", bad}),
                AllOf(HasSubstr("--image-size: must be S or H,W"), HasSubstr(bad)));
  }
}

TEST(MasterFlags, TheSharedGroupsFillEachSubCommandsOwnSettings) {
  MasterCommandLine line;
  ASSERT_EQ(parse_error({"train", "--model", "unet-resnet18", "--image-size", "64", "--batch-size",
                         "16", "--stages", "4", "--balance", "time", "--optimizer", "sgd"},
                        line),
            "");
  EXPECT_EQ(line.train.plan.model, "unet-resnet18");
  EXPECT_EQ(line.train.plan.image_size, 64);
  EXPECT_EQ(line.train.plan.batch_size, 16);
  EXPECT_EQ(line.train.plan.stages, 4);
  EXPECT_EQ(line.train.plan.balance, trainer::Balance::Time);
  EXPECT_EQ(line.train.plan.optimizer, trainer::Optimizer::Sgd);
  EXPECT_EQ(line.describe.image_size, 256);  // describe's own default, untouched

  MasterCommandLine describe;
  ASSERT_EQ(parse_error({"describe", "--stages", "5", "--classes", "3"}, describe), "");
  EXPECT_EQ(describe.describe.stages, 5);
  EXPECT_EQ(describe.describe.classes, 3);
}

TEST(MasterFlags, HelpShowsEveryDefault) {
  MasterCommandLine line;
  const std::string train = line.train_cmd->help();
  // CLI11 shows a default after the value's type and range: "--epochs INT:1 to 1048576=3".
  EXPECT_THAT(train, HasSubstr("--epochs INT:1 to 1048576=3"));
  EXPECT_THAT(train, HasSubstr("--lr-schedule constant|step|cosine|onecycle=constant"));
  EXPECT_THAT(train, HasSubstr("--pipeline gpipe|1f1b|zb "));
  EXPECT_THAT(train, HasSubstr("--rebalance auto|on|off=auto"));
  EXPECT_THAT(train, HasSubstr("--model TEXT=unet-resnet34"));
  EXPECT_THAT(train, HasSubstr("--normalize TEXT=imagenet"));
  EXPECT_THAT(train, HasSubstr("--augment TEXT=flip"));
  EXPECT_THAT(train, HasSubstr("(default bce+dice)"));  // --loss's default follows --classes
  EXPECT_THAT(train, HasSubstr("--lr FLOAT:above 0 to 1000=0.01"));
  EXPECT_THAT(line.describe_cmd->help(), HasSubstr("--image-size S|H,W=256"));
  EXPECT_THAT(line.predict_cmd->help(), HasSubstr("--threshold FLOAT:0 to 1=0.5"));
}

}  // namespace
}  // namespace ferry::apps
