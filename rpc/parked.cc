#include "ferry/rpc/parked.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"

namespace ferry::rpc {
namespace {

std::vector<std::string> strings_of(const c10::IValue& value) {
  std::vector<std::string> out;
  if (!value.isList()) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("expected a list of names but got {}", value.tagKind()));
  }
  for (const c10::IValue& item : value.toListRef()) out.push_back(item.toStringRef());
  return out;
}

// Every new owner takes its part of a park at once (a peer's take on a pool thread beside the
// owner's own): the dict a park holds is not safe to change from two threads.
std::mutex& takes_mutex() {
  static auto* m = new std::mutex();  // never destroyed: pool threads may take until exit
  return *m;
}

}  // namespace

ParkedTensors take_parked(const RRefPtr& park, const std::vector<std::string>& names,
                          bool for_peer) {
  const c10::IValue value = park->local_value();
  if (!value.isGenericDict()) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("park {} on worker \"{}\" holds a {}, not named tensors",
                            park->id().str(), self().name, value.tagKind()));
  }
  c10::impl::GenericDict held = value.toGenericDict();
  ParkedTensors out;
  std::lock_guard<std::mutex> lock(takes_mutex());
  for (const std::string& name : names) {
    auto it = held.find(name);
    if (it == held.end()) continue;
    at::Tensor t = it->value().toTensor();
    out.insert(name, for_peer && !t.is_cpu() ? t.cpu() : t);
    (void)held.erase(name);
  }
  return out;
}

ParkedTensors gather_parked(const std::vector<RRefPtr>& parks, std::vector<std::string> names,
                            const std::string& take_function) {
  ParkedTensors out;
  const std::string& here = self().name;
  for (const RRefPtr& park : parks) {
    if (names.empty()) break;
    ParkedTensors got;
    if (park->ownerName() == here) {
      got = take_parked(park, names, /*for_peer=*/false);
    } else {
      c10::List<std::string> wanted(names);
      const c10::IValue reply =
          rpc_sync(park->ownerName(), take_function, {to_ivalue(park), wanted});
      for (const auto& entry : reply.toGenericDict()) {
        got.insert(entry.key().toStringRef(), entry.value().toTensor());
      }
    }
    for (const auto& entry : got) out.insert(entry.key(), entry.value());
    names.erase(std::remove_if(names.begin(), names.end(),
                               [&got](const std::string& n) { return got.contains(n); }),
                names.end());
  }
  return out;
}

void install_park_taker(FunctionRegistry& registry, const std::string& name) {
  registry.add_raw(name, [](std::vector<c10::IValue>& args) {
    if (args.size() != 2) {
      throw Error(ErrorKind::InvalidArgument, "a park's taker takes (park, names)");
    }
    return c10::IValue(take_parked(to_rref(args[0]), strings_of(args[1]), /*for_peer=*/true));
  });
}

c10::IValue parks_value(const std::vector<RRefPtr>& parks) {
  c10::impl::GenericList out(c10::AnyType::get());
  for (const RRefPtr& park : parks) out.push_back(to_ivalue(park));
  return out;
}

std::vector<RRefPtr> parks_of(const c10::IValue& value) {
  if (!value.isList()) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("expected a list of parks but got {}", value.tagKind()));
  }
  std::vector<RRefPtr> out;
  for (const c10::IValue& item : value.toListRef()) out.push_back(to_rref(item));
  return out;
}

}  // namespace ferry::rpc
