#include "ferry/rpc/registry.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/support/error_of.h"

namespace ferry::rpc {
namespace {

using ferry::testing::kind_and_error_of;

c10::IValue call(FunctionRegistry& registry, const std::string& name,
                 std::vector<c10::IValue> args) {
  auto future = registry.invoke(name, args);
  future->wait();
  return future->value();
}

TEST(Registry, TypedFunctionsConvertArgumentsAndResults) {
  FunctionRegistry registry;
  registry.add("add", [](at::Tensor a, at::Tensor b) { return a + b; });
  registry.add("scale", [](double x, int64_t k) { return x * k; });
  registry.add("concat", [](std::string a, const std::string& b) { return a + b; });
  registry.add("sizes", [](std::vector<at::Tensor> ts) {
    std::vector<int64_t> out;
    for (auto& t : ts) out.push_back(t.numel());
    return out;
  });
  registry.add("nothing", []() {});

  EXPECT_TRUE(torch::equal(call(registry, "add", {torch::ones({2}), torch::ones({2})}).toTensor(),
                           torch::full({2}, 2.0)));
  EXPECT_EQ(call(registry, "scale", {1.5, int64_t{4}}).toDouble(), 6.0);
  EXPECT_EQ(call(registry, "scale", {int64_t{2}, int64_t{3}}).toDouble(), 6.0);
  EXPECT_EQ(call(registry, "concat", {std::string("en"), std::string("coder")}).toStringRef(),
            "encoder");
  c10::List<at::Tensor> list({torch::ones({3}), torch::ones({2, 2})});
  EXPECT_EQ(call(registry, "sizes", {list}).toIntVector(), std::vector<int64_t>({3, 4}));
  EXPECT_TRUE(call(registry, "nothing", {}).isNone());
}

TEST(Registry, WrongArityAndTypesAreNamedErrors) {
  FunctionRegistry registry;
  registry.add("add", [](at::Tensor a, at::Tensor b) { return a + b; });
  EXPECT_EQ(kind_and_error_of([&] { call(registry, "add", {torch::ones({1})}); }),
            "InvalidArgument: \"add\" takes 2 arguments but got 1");
  EXPECT_EQ(kind_and_error_of([&] {
              call(registry, "add", {torch::ones({1}), int64_t{3}});
            }),
            "InvalidArgument: argument 1 of \"add\" must be Tensor but got int");
}

TEST(Registry, UnknownFunctionListsTheRegisteredOnes) {
  FunctionRegistry registry;
  registry.add("b", []() {});
  registry.add("a", []() {});
  std::vector<c10::IValue> args;
  EXPECT_EQ(kind_and_error_of([&] { registry.invoke("c", args); }),
            "UnknownFunction: no function \"c\" is registered (registered: a, b)");
}

TEST(Registry, DuplicateNamesAreRefused) {
  FunctionRegistry registry;
  registry.add("f", []() {});
  EXPECT_EQ(kind_and_error_of([&] { registry.add("f", []() {}); }),
            "InvalidArgument: function \"f\" is already registered");
}

TEST(Registry, ThrowingFunctionFailsItsFuture) {
  FunctionRegistry registry;
  registry.add("boom", []() -> int64_t { throw std::runtime_error("out of cheese"); });
  std::vector<c10::IValue> args;
  auto future = registry.invoke("boom", args);
  ASSERT_TRUE(future->completed());
  EXPECT_TRUE(future->hasError());
  EXPECT_EQ(future->tryRetrieveErrorMessage(), "out of cheese");
}

}  // namespace
}  // namespace ferry::rpc
