// The words a setting of enum type is written as, in flags, plan files, checkpoints and logs: one
// table per enum, read both ways, so that a setting is parsed once, where it enters, and compared
// as a value everywhere else. A table may give one value several words (its first is the one
// written). No LibTorch; tables are immutable, safe from any thread.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ferry::core {

template <typename E>
using EnumNames = std::vector<std::pair<E, std::string_view>>;

// The words of `names`, in order.
template <typename E>
std::vector<std::string> words_of(const EnumNames<E>& names) {
  std::vector<std::string> words;
  for (const auto& [value, word] : names) words.emplace_back(word);
  return words;
}

// "a, b or c".
inline std::string listed(const std::vector<std::string>& words) {
  std::string text;
  for (std::size_t k = 0; k < words.size(); ++k) {
    if (k > 0) text += k + 1 == words.size() ? " or " : ", ";
    text += words[k];
  }
  return text;
}

// The word `value` is written as; a value a table leaves out is a bug, written "?".
template <typename E>
std::string name_of(const EnumNames<E>& names, E value) {
  for (const auto& [v, word] : names) {
    if (v == value) return std::string(word);
  }
  return "?";
}

// The value `word` names, if any.
template <typename E>
std::optional<E> value_named(const EnumNames<E>& names, std::string_view word) {
  for (const auto& [value, w] : names) {
    if (w == word) return value;
  }
  return std::nullopt;
}

// The value `word` names; otherwise std::invalid_argument naming `what` (a flag, a file's key) and
// every word there is: `--pipeline must be gpipe, 1f1b or zb, not "foo"`.
template <typename E>
E parse_named(const EnumNames<E>& names, std::string_view word, std::string_view what) {
  if (std::optional<E> value = value_named(names, word)) return *value;
  throw std::invalid_argument(
      fmt::format("{} must be {}, not \"{}\"", what, listed(words_of(names)), word));
}

}  // namespace ferry::core
