// The stages of pipelines a worker holds, by pipeline and stage index. Private to pipeline/.
//
// Thread rules: every method may be called from any thread; what a returned pointer points to
// is guarded by its own lock, not this table's.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ferry/rpc/error.h"

namespace ferry::pipeline {

template <typename Slot>
class SlotTable {
 public:
  using SlotPtr = std::shared_ptr<Slot>;

  // Sets stage `index` of `pipeline` up, in place of what was there.
  void put(std::int64_t pipeline, std::int64_t index, SlotPtr slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    slots_[{pipeline, index}] = std::move(slot);
  }

  // Stage `index` of `pipeline`. Throws rpc::Error(InvalidArgument) saying it is not set up on
  // `worker` (this worker's name).
  SlotPtr at(std::int64_t pipeline, std::int64_t index, const std::string& worker) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = slots_.find({pipeline, index});
    if (it == slots_.end()) {
      throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                       fmt::format("stage {} of pipeline {} is not set up on worker \"{}\"", index,
                                   pipeline, worker));
    }
    return it->second;
  }

  // Every stage of `pipeline` held here, by index.
  std::vector<SlotPtr> of(std::int64_t pipeline) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<SlotPtr> out;
    for (auto it = slots_.lower_bound({pipeline, kFirstIndex});
         it != slots_.end() && it->first.first == pipeline; ++it) {
      out.push_back(it->second);
    }
    return out;
  }

  // Every stage of every pipeline held here.
  std::vector<SlotPtr> all() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<SlotPtr> out;
    for (const auto& [key, slot] : slots_) out.push_back(slot);
    return out;
  }

  // Forgets every stage of `pipeline`; a slot still in use lives on until its last user lets go.
  void erase(std::int64_t pipeline) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = slots_.lower_bound({pipeline, kFirstIndex});
    while (it != slots_.end() && it->first.first == pipeline) it = slots_.erase(it);
  }

 private:
  static constexpr std::int64_t kFirstIndex = std::numeric_limits<std::int64_t>::min();
  mutable std::mutex mutex_;
  std::map<std::pair<std::int64_t, std::int64_t>, SlotPtr> slots_;
};

}  // namespace ferry::pipeline
