// Whether this test binary (and so the servers it starts: one build, one set of flags) runs
// under a sanitizer. Under one, its allocator keeps freed memory in quarantine, pads every
// block and maps shadow memory: resident memory says nothing about a server's stated bound,
// so memory tests check everything else and say that they skipped the memory figures.
#pragma once

#include <cstdint>
#include <cstdio>

namespace parasync::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// Resident memory at most `bytes`: true under a sanitizer (see kSanitized), saying so.
inline bool MemoryWithin(int64_t resident, int64_t bytes) {
  if (kSanitized) {
    std::printf("memory figures not checked under a sanitizer\n");
    return true;
  }
  return resident <= bytes;
}

}  // namespace parasync::testing
