#include "common/denormals.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace parasync {

namespace {

#if defined(__x86_64__) || defined(__i386__)
constexpr unsigned kFlushZero = 0x8000;       // MXCSR.FTZ
constexpr unsigned kDenormalsZero = 0x0040;   // MXCSR.DAZ
unsigned ReadBits() { return _mm_getcsr(); }
void WriteBits(unsigned bits) { _mm_setcsr(bits); }
constexpr unsigned kBoth = kFlushZero | kDenormalsZero;
#elif defined(__aarch64__)
// FPCR.FZ flushes both results and operands on Arm.
constexpr uint64_t kBoth = uint64_t{1} << 24;
uint64_t ReadBits() {
  uint64_t fpcr;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
  return fpcr;
}
void WriteBits(uint64_t fpcr) { __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr)); }
#else
#error "parasync sets the flush-to-zero bits on x86-64 and aarch64 only"
#endif

}  // namespace

bool DenormalsKeptByEnvironment() {
  static const bool keep = [] {
    const char* v = std::getenv("PARASYNC_DENORMALS");
    return v != nullptr && std::strcmp(v, "keep") == 0;
  }();
  return keep;
}

bool FlushDenormalsOnThisThread() {
  if (!DenormalsKeptByEnvironment()) WriteBits(ReadBits() | kBoth);
  return DenormalsFlushedOnThisThread();
}

bool DenormalsFlushedOnThisThread() { return (ReadBits() & kBoth) == kBoth; }

void KeepDenormalsOnThisThread() { WriteBits(ReadBits() & ~kBoth); }

}  // namespace parasync
