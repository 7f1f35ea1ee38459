// An enum's words read both ways: the first word of a value is the one written, every word is
// read, and an unknown one is refused naming what was being read and every word there is.
#include "ferry/core/enum_names.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>

namespace ferry::core {
namespace {

enum class Colour { Red, Green, Blue };

const EnumNames<Colour>& colours() {
  static const EnumNames<Colour> names = {{Colour::Red, "red"},
                                          {Colour::Green, "green"},
                                          {Colour::Green, "lime"},
                                          {Colour::Blue, "blue"}};
  return names;
}

TEST(EnumNames, AValueIsWrittenAsItsFirstWordAndReadFromAnyOfItsWords) {
  EXPECT_EQ(name_of(colours(), Colour::Green), "green");
  EXPECT_EQ(value_named(colours(), "lime"), Colour::Green);
  EXPECT_EQ(value_named(colours(), "blue"), Colour::Blue);
  EXPECT_EQ(value_named(colours(), "Blue"), std::nullopt);  // words are exact
  EXPECT_EQ(value_named(colours(), ""), std::nullopt);
  for (const auto& [value, word] : colours()) {
    EXPECT_EQ(parse_named(colours(), name_of(colours(), value), "--colour"), value);
  }
}

TEST(EnumNames, AnUnknownWordIsRefusedNamingWhatWasReadAndEveryWord) {
  try {
    parse_named(colours(), "purple", "--colour");
    FAIL() << "accepted purple";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "--colour must be red, green, lime or blue, not \"purple\"");
  }
  EXPECT_EQ(listed({"a"}), "a");
  EXPECT_EQ(listed({"a", "b"}), "a or b");
  EXPECT_EQ(listed({}), "");
}

}  // namespace
}  // namespace ferry::core
