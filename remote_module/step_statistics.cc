#include "ferry/remote_module/step_statistics.h"

namespace ferry::remote_module {
namespace {

thread_local ForwardPass current;

}  // namespace

const ForwardPass& current_forward_pass() { return current; }

ForwardPassScope::ForwardPassScope(ForwardPass pass) : previous_(current) { current = pass; }

ForwardPassScope::~ForwardPassScope() { current = previous_; }

}  // namespace ferry::remote_module
