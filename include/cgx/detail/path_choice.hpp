#pragma once
/// \file path_choice.hpp
/// `cgx::detail::path_choice`: the measured choice between a plan's compressed schedule
/// and its transport's uncompressed native allreduce, per size class of call
/// (plan_options::native_below_bytes = auto_threshold). See docs/threshold.md.
///
/// Calls are grouped by size class: the bytes of the call rounded down to a power of
/// two. Calls under measured_floor_bytes always take the native path (one bucket or
/// less: nothing to save, latency decides). In every other class:
///
///  - probing: the class's first 8 calls alternate native, compressed, native, ...;
///    the first pair warms both paths (caches, pages, connections) and is not counted;
///    each rank keeps the fastest of the other three of each path. After the eighth call
///    the ranks agree (one max_all of two integers): the slowest rank's time of each
///    path counts, and the faster path is the class's pick, on every rank.
///  - decided: every call takes the pick and is timed (the two latest are kept). Every
///    `interval` calls the class is re-checked: two calls take the other path, then the
///    ranks agree again on the fastest of those two against the fastest of the pick's
///    two latest. When the pick stands the interval doubles (16 up to 256 calls), when
///    it flips it returns to 16: the choice follows the link and the load, and a stable
///    choice costs at most 2 calls of the slower path in 256.
///  - inferred: a class met after others were decided skips probing when its measured
///    neighbours already answer it. In the alpha-beta model (cgx::model) both paths cost
///    a latency plus a time per byte, and a path that wins by a wide margin at some size
///    does so through its time per byte, so it wins at every larger size (compressed) or
///    every smaller one (native, whose latency is the lower). So when the nearest
///    measured class below picked compressed by at least inference_margin (its agreed
///    native time >= margin x its compressed time), a new class takes compressed from its
///    first call; when the nearest measured class above picked native by the margin, it
///    takes native. Contradicting or close neighbours: the class is probed. An inferred
///    pick is a decided one whose first re-check comes after 16 calls, as after probing,
///    so a wrong inference costs at most 16 calls and is corrected by measurement.
///
/// Which call probes what depends only on the class's call count, which is the same on
/// every rank (every rank makes the same calls with the same counts), each decision is
/// agreed collectively, and an inference reads only agreed times and which classes are
/// decided, so every rank always takes the same path.

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

namespace cgx {

/// What a plan's measured choice knows of one size class (see allreduce_plan::path_for).
struct path_pick {
  bool measured = false;     ///< false while the class is still being probed (or was never called); true once decided
  bool inferred = false;     ///< the pick was inferred from a measured neighbouring class, not yet confirmed by a re-check
  bool compressed = false;   ///< the pick: true for the compressed schedule, false for the native allreduce
  double native_s = 0;       ///< the agreed (slowest rank's) time of the native path at the last decision, seconds
  double compressed_s = 0;   ///< the same for the compressed path (0: not measured)
  std::uint32_t calls = 0;   ///< calls made in this class
  std::uint32_t decisions = 0;  ///< decisions taken (1 after probing, +1 per re-check)
  std::uint32_t flips = 0;      ///< decisions that changed the pick
};

namespace detail {

class path_choice {
 public:
  /// Calls under this many bytes always take the native path (a bucket of 1024 floats).
  static constexpr std::size_t measured_floor_bytes = 4096;
  static constexpr std::uint32_t probe_calls = 8;
  static constexpr std::uint32_t first_interval = 16;
  static constexpr std::uint32_t max_interval = 256;
  /// A neighbour's pick is carried to a new class only when it won by this factor.
  static constexpr std::int64_t inference_margin = 2;

  /// The size class of a call of `bytes` (>= measured_floor_bytes).
  static unsigned size_class(std::size_t bytes) noexcept { return static_cast<unsigned>(std::bit_width(bytes) - 1); }

  /// True if the next call of `bytes` bytes takes the compressed path (advances nothing).
  [[nodiscard]] bool compress_next(std::size_t bytes) const noexcept {
    if (bytes < measured_floor_bytes) return false;
    const unsigned cls = size_class(bytes);
    const entry& e = classes_[cls];
    if (e.phase == probing && e.calls == 0) return infer(cls) == infer_compressed;
    if (e.phase == probing) return (e.calls & 1u) != 0;  // native, compressed, native, ...
    const bool recheck = e.calls >= e.next_check;       // two calls on the other path
    return recheck ? !e.pick : e.pick;
  }

  /// True if record() will use the time of the next call of `bytes` bytes: a probe, a
  /// re-check, or one of the two calls on the pick just before a re-check. The others
  /// are only counted, so that a decided class reads no clock on most calls.
  [[nodiscard]] bool times_next(std::size_t bytes) const noexcept {
    if (bytes < measured_floor_bytes) return false;
    const entry& e = classes_[size_class(bytes)];
    return e.phase == probing || e.calls + 2 >= e.next_check;
  }

  /// Records a call of `bytes` that took `compressed` and lasted `ns` on this rank; at a
  /// decision point agrees with the peers through `agree` (a collective max over a span
  /// of two int64, e.g. the transport's max_all). Collective at decision points only.
  template <class Agree>
  void record(std::size_t bytes, bool compressed, std::int64_t ns, Agree&& agree) {
    if (bytes < measured_floor_bytes) return;
    const unsigned cls = size_class(bytes);
    entry& e = classes_[cls];
    if (e.phase == probing && e.calls == 0) {
      if (const inference i = infer(cls); i != infer_none) {
        e.phase = decided;
        e.inferred = true;
        e.pick = i == infer_compressed;
        e.next_check = first_interval;
      }
    }
    const std::uint32_t k = e.calls++;
    if (e.phase == probing) {
      if (k >= 2) keep_min(compressed ? e.probe_c : e.probe_n, ns);
      if (k == probe_calls - 1) decide(e, e.probe_n, e.probe_c, agree);
      return;
    }
    if (k < e.next_check) {  // a call on the pick
      e.recent[k & 1u] = ns;
      return;
    }
    // A re-check call on the other path.
    keep_min(e.probe_other, ns);
    if (k == e.next_check + 1) {
      const std::int64_t mine = std::min(e.recent[0], e.recent[1]);
      if (e.pick)
        decide(e, e.probe_other, mine, agree);
      else
        decide(e, mine, e.probe_other, agree);
    }
  }

  /// What is known of the class of `bytes`.
  [[nodiscard]] path_pick pick_for(std::size_t bytes) const noexcept {
    path_pick p;
    if (bytes < measured_floor_bytes) {
      p.measured = true;
      return p;
    }
    const entry& e = classes_[size_class(bytes)];
    p.measured = e.phase == decided;
    p.inferred = e.inferred;
    p.compressed = e.pick;
    p.native_s = static_cast<double>(e.agreed_n) * 1e-9;
    p.compressed_s = static_cast<double>(e.agreed_c) * 1e-9;
    p.calls = e.calls;
    p.decisions = e.decisions;
    p.flips = e.flips;
    return p;
  }

 private:
  enum phase_t : std::uint8_t { probing, decided };
  static constexpr std::int64_t none = INT64_MAX;
  struct entry {
    std::uint32_t calls = 0;
    std::uint32_t next_check = 0;
    std::uint32_t interval = first_interval;
    std::uint32_t decisions = 0;
    std::uint32_t flips = 0;
    phase_t phase = probing;
    bool pick = false;
    bool inferred = false;  // decided by infer(), not yet re-checked
    std::int64_t probe_n = none, probe_c = none, probe_other = none;
    std::array<std::int64_t, 2> recent{none, none};
    std::int64_t agreed_n = 0, agreed_c = 0;
  };

  static void keep_min(std::int64_t& slot, std::int64_t ns) noexcept { slot = std::min(slot, ns); }

  enum inference : std::uint8_t { infer_none, infer_native, infer_compressed };

  /// What the nearest measured classes below and above say of class `cls` (see the file
  /// comment); reads only agreed times and decided states: the same on every rank.
  [[nodiscard]] inference infer(unsigned cls) const noexcept {
    const auto measured = [](const entry& e) { return e.phase == decided && !e.inferred && e.decisions > 0; };
    bool up = false, down = false;
    for (unsigned b = cls; b-- > 0;)
      if (measured(classes_[b])) {
        const entry& e = classes_[b];
        up = e.pick && e.agreed_n >= inference_margin * e.agreed_c;
        break;
      }
    for (unsigned a = cls + 1; a < classes_.size(); ++a)
      if (measured(classes_[a])) {
        const entry& e = classes_[a];
        down = !e.pick && e.agreed_c >= inference_margin * e.agreed_n;
        break;
      }
    if (up == down) return infer_none;  // neither, or neighbours that contradict
    return up ? infer_compressed : infer_native;
  }

  template <class Agree>
  static void decide(entry& e, std::int64_t native_ns, std::int64_t compressed_ns, Agree& agree) {
    std::array<std::int64_t, 2> v{native_ns, compressed_ns};
    agree(std::span<std::int64_t>(v));  // the slowest rank's time of each path
    const bool pick = v[1] < v[0];
    const bool same = e.phase == decided && pick == e.pick;
    if (e.phase == decided && !same) ++e.flips;
    e.interval = same ? std::min(e.interval * 2, max_interval) : first_interval;
    e.phase = decided;
    e.inferred = false;
    e.pick = pick;
    e.agreed_n = v[0];
    e.agreed_c = v[1];
    ++e.decisions;
    e.next_check = e.calls + e.interval;
    e.probe_other = none;
    e.recent = {none, none};
  }

  std::array<entry, 64> classes_{};
};

/// Nanoseconds since an arbitrary epoch, monotonic.
inline std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Runs one call of `bytes` bytes on the path `choice` picks for it (`compressed()` or
/// `native()`), times it and records it (agreeing through x.max_all at decision points).
/// Returns true if it took the compressed path.
template <class X, class Native, class Compressed>
bool run_chosen(path_choice& choice, X& x, std::size_t bytes, Native&& native, Compressed&& compressed) {
  const bool c = choice.compress_next(bytes);
  const bool timed = choice.times_next(bytes);
  const std::int64_t t0 = timed ? now_ns() : 0;
  if (c)
    compressed();
  else
    native();
  if (bytes >= path_choice::measured_floor_bytes)
    choice.record(bytes, c, timed ? now_ns() - t0 : 0, [&x](std::span<std::int64_t> v) { x.max_all(v); });
  return c;
}

}  // namespace detail
}  // namespace cgx
