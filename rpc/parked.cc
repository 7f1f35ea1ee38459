#include "ferry/rpc/parked.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <mutex>

#include "ferry/rpc/error.h"
#include "ferry/rpc/fan_out.h"
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

c10::impl::GenericDict held_by(const RRefPtr& park) {
  const c10::IValue value = park->local_value();
  if (!value.isGenericDict()) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("park {} on worker \"{}\" holds a {}, not named tensors",
                            park->id().str(), self().name, value.tagKind()));
  }
  return value.toGenericDict();
}

}  // namespace

ParkedTensors take_parked(const RRefPtr& park, const std::vector<std::string>& names,
                          bool for_peer) {
  c10::impl::GenericDict held = held_by(park);
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

ParkedTensors take_parked_part(const RRefPtr& park, std::int64_t max_bytes) {
  const c10::impl::GenericDict held = held_by(park);
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> lock(takes_mutex());
    std::int64_t bytes = 0;
    for (const auto& entry : held) {
      const auto size = static_cast<std::int64_t>(entry.value().toTensor().nbytes());
      if (!names.empty() && bytes + size > max_bytes) break;
      names.push_back(entry.key().toStringRef());
      bytes += size;
    }
  }
  return take_parked(park, names, /*for_peer=*/true);
}

void install_park_part_taker(FunctionRegistry& registry, const std::string& name) {
  registry.add(
      name, [](RRefPtr park, std::int64_t max_bytes) { return take_parked_part(park, max_bytes); });
}

std::vector<ParkedTensors> bring_parks(const std::vector<RRefPtr>& parks,
                                       const std::string& take_function, std::int64_t part_bytes,
                                       const std::function<std::string(std::size_t)>& label) {
  std::vector<ParkedTensors> out(parks.size());
  std::vector<std::size_t> open;
  for (std::size_t k = 0; k < parks.size(); ++k) {
    try {
      parks[k]->ready()->wait();
    } catch (const std::exception&) {
      rethrow_as(std::current_exception(), fmt::format("{} was never made", label(k)));
    }
    if (parks[k]->ownerName() == self().name) {
      out[k] = take_parked_part(parks[k], std::numeric_limits<std::int64_t>::max());
    } else {
      open.push_back(k);
    }
  }
  while (!open.empty()) {
    FanOut calls;
    for (std::size_t k : open) {
      calls.call(parks[k]->ownerName(), take_function, {to_ivalue(parks[k]), part_bytes}, label(k));
    }
    const std::vector<c10::IValue> parts = calls.wait();
    std::vector<std::size_t> still_open;
    for (std::size_t i = 0; i < open.size(); ++i) {
      const c10::impl::GenericDict part = parts[i].toGenericDict();
      if (part.empty()) continue;
      for (const auto& entry : part) {
        out[open[i]].insert(entry.key().toStringRef(), entry.value().toTensor());
      }
      still_open.push_back(open[i]);
    }
    open = std::move(still_open);
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
