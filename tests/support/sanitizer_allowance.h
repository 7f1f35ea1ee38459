// What tests that bound memory or time allow for a build with AddressSanitizer (FERRY_SANITIZE):
// freed memory waits in ASan's quarantine (256 MiB by default) before it is reused, and an
// instrumented process, LibTorch's start-up included, runs several times slower.
#pragma once

namespace ferry::testing {

#ifdef FERRY_SANITIZE
inline constexpr double kSanitizerExtraMiB = 256.0;
inline constexpr int kSanitizerSlowdown = 4;
#else
inline constexpr double kSanitizerExtraMiB = 0.0;
inline constexpr int kSanitizerSlowdown = 1;
#endif

}  // namespace ferry::testing
