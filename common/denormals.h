// Denormal (subnormal) floats and the threads that compute. x86 arithmetic on a denormal
// operand or result takes a slow microcode path, many times slower than on a normal float,
// and training makes them: Adam's moments of rarely touched weights decay geometrically
// until they reach that range and stay there. A 2-server async MLP run slowed from 23,765 to
// 11,480 examples/sec over 9 epochs that way (docs/performance.md). Flushing them to zero
// (FTZ: a denormal result is 0; DAZ: a denormal operand reads as 0) costs nothing measurable
// in accuracy at float32 training precision; TensorFlow sets the same bits on its compute
// threads for the same reason.
//
// The bits are per thread (x86's MXCSR, Arm's FPCR.FZ). Linux gives a new thread its
// creator's, but a pool made before they were set, or by a thread that never set them, does
// not have them: so every thread that applies updates or computes sets them itself, where it
// is made or first runs (parasync-ps's loop and its ParallelFor helpers, the worker's
// training thread and its OpenMP compute threads, the CUDA module's calling thread).
//
// PARASYNC_DENORMALS=keep in the environment leaves IEEE denormals on: for measuring the
// difference (tools/bench-denormals), not for training. Thread-safe: each call touches only the
// calling thread's state.
#pragma once

namespace parasync {

// Sets flush-to-zero and denormals-are-zero on the calling thread, unless
// PARASYNC_DENORMALS=keep. Returns whether the calling thread now flushes denormals.
bool FlushDenormalsOnThisThread();

// Whether the calling thread flushes denormal results and operands to zero (both bits set).
bool DenormalsFlushedOnThisThread();

// Clears both bits on the calling thread (IEEE denormals, the hardware default). For tests
// and benchmarks that need a thread in the state a new process starts in.
void KeepDenormalsOnThisThread();

// Whether PARASYNC_DENORMALS=keep asks for IEEE denormals (read once per process).
bool DenormalsKeptByEnvironment();

}  // namespace parasync
