#pragma once
/// \file layerwise_plan.hpp
/// `cgx::layerwise_plan<T, X, Rounding>`: CGX's layer-wise compressed allreduce of one
/// fused buffer holding many layers, each with its own run-time setting (bits 1..8 or
/// uncompressed, bucket size), on host buffers.
///
/// The schedule is the scatter-reduce-allgather of scatter_reduce_allgather.hpp over
/// the chunks of layerwise.hpp (cut at bucket and layer boundaries): rank r != o
/// compresses its part of chunk o piece by piece, each piece with its layer's
/// quantizer, into one message; o decodes and adds the p - 1 messages in rank order,
/// compresses the sum once, decodes it into its own buffer and sends that one message
/// to every rank. One message per pair of ranks per phase, whatever the number of
/// layers. Peers, workspace slots, the order of sums and the random keys are those of
/// schedule::sra_pattern (schedule/sra.hpp), run over layerwise.hpp's cut: stream =
/// sender rank in phase 1, p + owner in phase 2, position = the piece's index in the
/// fused buffer, counter = the call number (with error feedback the encoding is
/// deterministic: error_feedback.hpp).
/// All ranks end with the same bits; the error bound of each value
/// is the SRA's with its layer's unit (uncompressed layers: the exact sum in rank
/// order).
///
/// Traffic per rank and call: sum over r != me of chunk_bytes(r) plus (p - 1) *
/// chunk_bytes(me) sent, as much received (`bytes_sent()`).

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "allreduce_plan.hpp"
#include "concepts.hpp"
#include "error.hpp"
#include "error_feedback.hpp"
#include "layerwise.hpp"
#include "plan_common.hpp"
#include "quant/host_exec.hpp"
#include "quant/rounding.hpp"
#include "detail/tags.hpp"
#include "schedule/sra.hpp"

namespace cgx {

/// Run-time options of a layer-wise plan.
struct layerwise_options {
  layerwise_defaults defaults{};         ///< settings the layers start with (see default_settings)
  /// Keep per-rank residuals (error_feedback.hpp): n * sizeof(T) bytes. The compressed
  /// layers are then encoded deterministically, whatever the plan's Rounding: nearest
  /// rounding at 2..8 bits, two levels (the means of either side of the bucket's mean)
  /// at 1 bit; every rank must set the same value (checked with the settings).
  bool error_feedback = false;
  /// With error feedback: the factor each residual is carried into the next call with,
  /// in [0, 1] (error_feedback.hpp, "Decay"). 1 (the default) keeps it whole; 0.5 halves
  /// it every call (what cgx_torch's hook uses at 1 bit: better under Adam). Every rank
  /// must set the same value (checked with the settings).
  double error_feedback_decay = 1.0;
  /// With error feedback: also feed back the error of quantizing the sum of the chunk this
  /// rank owns (true: the residual of the owned chunk is the sum's re-quantization error,
  /// added into the next call's sum), or feed back only the error of this rank's own
  /// contributions (false: the sum is encoded with the same deterministic encoder and
  /// its error is dropped). Every rank must set the same value (checked with the settings).
  bool error_feedback_sum = true;
  checking check = checking::automatic;  ///< argument checking level (as allreduce_plan's)
  std::uint64_t seed = 0x63677821u;      ///< seed of stochastic rounding
  int threads = 1;                       ///< host threads for (de)compression, per rank
  std::uint32_t timeout_ms = default_timeout_ms();  ///< wait limit in ms, 0: none (as plan_options::timeout_ms: 10 minutes or CGX_TIMEOUT_MS)
  bool verify = false;                   ///< checksum every message (as plan_options::verify)
};

namespace detail {
/// The host kernels of one setting, resolved once per settings change.
template <class T>
struct host_codec {
  void (*compress)(const T*, std::size_t, std::byte*, const quant::rng_state&, quant::host_exec);
  void (*decompress)(const std::byte*, std::size_t, T*, quant::host_exec);
  void (*decompress_add)(const std::byte*, std::size_t, T*, quant::host_exec);
  bool lossless;
};

template <class T, class Rounding>
host_codec<T> make_host_codec(const layer_setting& s) {
  return with_quantizer<Rounding>(s, [](auto q) {
    using Q = typename decltype(q)::type;
    return host_codec<T>{&Q::template compress<T>, &Q::template decompress<T>, &Q::template decompress_add<T>,
                         Q::lossless};
  });
}



/// What the host and device layer-wise plans share: the transport, the layout and its
/// cut for the current settings, the settings and their resolved kernels (`Codec`,
/// made by `Derived::make_codec`), argument checking and traffic accounting. `Derived`
/// provides `make_codec(setting)`, `piece_align` and `reserve(slot_bytes)` (workspace
/// for 2 p slots), and calls `init()` at the end of its constructor.
template <class Derived, class T, class X, class Codec>
class layerwise_base {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "cgx::layerwise_plan: T must be float or double");
  static_assert(requires(X& x, std::span<std::int64_t> v) {
                  { x.size() } -> std::convertible_to<int>;
                  { x.rank() } -> std::convertible_to<int>;
                  x.max_all(v);
                }, "cgx::layerwise_plan: X must be a transport (e.g. cgx::comm::mpi)");

 public:
  using value_type = T;
  using transport_type = X;

  /// Replaces every layer's setting (one per layer, in the order of the layer list).
  /// Local: every rank must make the same change before its next call. Throws
  /// cgx::error(errc::invalid_argument), keeping the old settings, for a wrong count,
  /// bits outside 0..8 or a bucket not compiled in (layerwise_buckets), and at once
  /// when another thread is in a call of this plan.
  void set_settings(std::vector<layer_setting> s) {
    const call_guard claimed(busy_, "layerwise_plan::set_settings");
    if (s.size() != layout_.layers().size())
      throw error(errc::invalid_argument, "layerwise_plan: " + std::to_string(s.size()) + " settings for " +
                                              std::to_string(layout_.layers().size()) + " layers");
    for (std::size_t i = 0; i < s.size(); ++i) validate_setting(s[i], i);
    std::vector<Codec> codecs(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) codecs[i] = static_cast<Derived*>(this)->make_codec(s[i]);
    layerwise_layout cut = layout_;
    cut.cut(s, x_.size(), &setting_bytes<T>, Derived::piece_align);
    static_cast<Derived*>(this)->reserve(cut.slot_bytes());
    layout_ = std::move(cut);
    settings_ = std::move(s);
    codecs_ = std::move(codecs);
    signature_hash h;
    h.mix(sizeof(T));
    h.mix(Derived::rounding_id);
    if (opts_.error_feedback) h.mix(0x6566);  // EF encodes with nearest rounding: ranks must agree
    if (opts_.error_feedback && opts_.error_feedback_decay != 1.0) {  // mixed only then: old signatures stay
      h.mix(std::bit_cast<std::uint64_t>(opts_.error_feedback_decay));
    }
    if (opts_.error_feedback && !opts_.error_feedback_sum) h.mix(0x6573);  // "es": mixed only then
    h.mix(layout_.size());
    for (std::size_t i = 0; i < settings_.size(); ++i) {
      h.mix(layout_.layers()[i].offset);
      h.mix(layout_.layers()[i].count);
      h.mix(static_cast<std::uint64_t>(settings_[i].bits));
      h.mix(settings_[i].bits == 0 ? 0 : settings_[i].bucket);
    }
    sig_ = h.value();
  }

  /// Sets one layer's bits (0 = uncompressed), keeping its bucket. Local, like set_settings.
  void set_bits(std::size_t index, int bits) {
    if (index >= settings_.size())
      throw error(errc::invalid_argument, "layerwise_plan: no layer " + std::to_string(index));
    std::vector<layer_setting> s = settings_;
    s[index].bits = bits;
    set_settings(std::move(s));
  }

  /// The current settings, one per layer.
  const std::vector<layer_setting>& settings() const noexcept { return settings_; }
  /// The layers as given.
  const std::vector<layer>& layers() const noexcept { return layout_.layers(); }
  /// The cut into chunks for the current settings.
  const layerwise_layout& layout() const noexcept { return layout_; }
  /// Values in the fused buffer.
  std::size_t size() const noexcept { return layout_.size(); }
  /// Bytes this rank sends per call with the current settings (0 on one rank): its part
  /// of every other chunk (phase 1), then its own chunk's sum to every peer (phase 2).
  std::size_t bytes_sent() const {
    const int p = x_.size();
    if (p == 1) return 0;
    return scatter_bytes_sent() + static_cast<std::size_t>(p - 1) * layout_.chunk_bytes(x_.rank());
  }
  /// Average bits per value over the layers (uncompressed values count 8 sizeof(T)),
  /// metadata excluded.
  double average_bits() const {
    double bits = 0, count = 0;
    for (std::size_t i = 0; i < settings_.size(); ++i) {
      const double c = static_cast<double>(layout_.layers()[i].count);
      bits += c * (settings_[i].bits == 0 ? 8.0 * sizeof(T) : settings_[i].bits);
      count += c;
    }
    return count == 0 ? 0.0 : bits / count;
  }
  /// Calls made so far: the key of the next call's random bits (stochastic rounding).
  std::uint32_t calls() const noexcept { return calls_; }
  /// Sets the call counter, e.g. to resume from a checkpoint (calls() of the plan that
  /// took it): the next call then draws the random bits that plan's next call would
  /// have. Local: every rank must set the same value before its next call (collective
  /// checking does not see it). Throws cgx::error(errc::invalid_argument) at once when
  /// another thread is in a call of this plan.
  void set_calls(std::uint32_t c) {
    const call_guard claimed(busy_, "layerwise_plan::set_calls");
    calls_ = c;
  }
  /// The transport.
  X& transport() noexcept { return x_; }
  const X& transport() const noexcept { return x_; }

  layerwise_base(const layerwise_base&) = delete;
  layerwise_base& operator=(const layerwise_base&) = delete;

 protected:
  static constexpr int tag_scatter = cgx::detail::tag_value(cgx::detail::tag::layerwise_scatter);
  static constexpr int tag_gather = cgx::detail::tag_value(cgx::detail::tag::layerwise_gather);

  /// SRA's pattern over the layer-wise cut (schedule::sra_pattern), for both plans: one
  /// message per chunk, p send and p receive slots of `slot` bytes, the allgather
  /// receiving into the receive slots. The cut itself is layerwise.hpp's: at layer and
  /// per-layer bucket boundaries, not schedule::sra's single granule.
  static schedule::sra_pattern pattern(int p, std::size_t slot) { return {p, 1, slot}; }

  layerwise_base(X transport, std::size_t n, std::vector<layer> layers, layerwise_options opts)
      : x_(std::move(transport)), layout_(n, std::move(layers)), opts_(opts) {
    if (opts_.threads < 1) throw error(errc::invalid_argument, "layerwise_plan: threads must be >= 1");
    if (!(opts_.error_feedback_decay >= 0.0 && opts_.error_feedback_decay <= 1.0))
      throw error(errc::invalid_argument, "layerwise_plan: error_feedback_decay must be in [0, 1] (got " +
                                              std::to_string(opts_.error_feedback_decay) + ")");
    detail::configure_transport(x_, opts_.timeout_ms, opts_.verify);
    sized("layerwise_plan", n, x_.size(), [&] {
      check_raw_bytes(n, sizeof(T));
      return n;
    });
  }
  ~layerwise_base() = default;

  /// Reserves workspace for the larger of all-uncompressed and the default settings,
  /// and applies the defaults.
  void init() {
    layerwise_layout all_raw = layout_;
    const std::vector<layer_setting> raw(layout_.layers().size(), layer_setting{0, 1024});
    all_raw.cut(raw, x_.size(), &setting_bytes<T>, Derived::piece_align);
    static_cast<Derived*>(this)->reserve(all_raw.slot_bytes());
    set_settings(default_settings(layout_.layers(), opts_.defaults));
  }

  /// Bytes this rank sends in phase 1 (scatter-reduce): its part of every other chunk.
  std::size_t scatter_bytes_sent() const {
    const int p = x_.size(), me = x_.rank();
    std::size_t b = 0;
    for (int r = 0; r < p; ++r)
      if (r != me) b += layout_.chunk_bytes(r);
    return b;
  }

  /// The random-bit key of the next call.
  quant::rng_state next_rng() {
    quant::rng_state rng;
    rng.seed = opts_.seed;
    rng.counter = calls_++;
    return rng;
  }

  void check(const void* buf, std::size_t n, const char* refusal = nullptr) { check(buf, n, sig_, refusal); }
  /// The argument check of a call whose operation has signature `sig` (sig_, or sig_
  /// mixed with an operation's tag: ranks in different operations then disagree).
  /// `refusal`: why this rank must refuse the call for a reason of its own (the device
  /// plan's CUDA-graph capture), or nullptr.
  void check(const void* buf, std::size_t n, std::int64_t sig, const char* refusal = nullptr) {
    enum : std::int64_t { null_buffer = 1, wrong_size = 2, refused = 4 };
    std::int64_t bad = 0;
    if (buf == nullptr && n > 0) bad |= null_buffer;
    if (n != layout_.size()) bad |= wrong_size;
    if (refusal != nullptr) bad |= refused;
    auto where = [this] { return "layerwise_plan (rank " + std::to_string(x_.rank()) + "): "; };
    auto local_message = [&]() -> std::string {
      if (bad & null_buffer) return "null buffer with count " + std::to_string(n) + " > 0";
      if (bad & wrong_size)
        return "count " + std::to_string(n) + " differs from the plan's buffer size " + std::to_string(layout_.size());
      return refusal;
    };
    if (resolve(opts_.check) == checking::local) {
      if (bad != 0) detail::refuse_call(x_, where() + local_message());  // the peers hear of it at once
      if constexpr (requires { x_.throw_if_failed(); }) x_.throw_if_failed();
      return;
    }
    if constexpr (requires { x_.throw_if_failed(); }) x_.throw_if_failed();  // before the collective step
    std::array<std::int64_t, 3> v{sig, -sig, bad};
    x_.max_all(v);
    if (bad != 0) throw error(errc::invalid_argument, where() + local_message());
    if (v[2] != 0)
      throw error(errc::invalid_argument, where() + "another rank passed invalid arguments; no data was moved");
    if (v[0] != -v[1])
      throw error(errc::mismatch, where() + "ranks have different layers or settings (bits, buckets), value "
                                          "types or error-feedback options; no data was moved");
  }

  X x_;
  layerwise_layout layout_;
  layerwise_options opts_;
  std::vector<layer_setting> settings_;
  std::vector<Codec> codecs_;
  std::int64_t sig_ = 0;
  std::uint32_t calls_ = 0;
  std::atomic<bool> busy_{false};  // held by a call in progress (call_guard)
};

}  // namespace detail

/// Layer-wise compressed allreduce (sum, in place) of a fused buffer of n values of T
/// described by a list of layers (see the file comment and layerwise.hpp).
///
/// \tparam T         float or double
/// \tparam X         transport, e.g. comm::mpi
/// \tparam Rounding  quant::stochastic (CGX's) or quant::nearest
///
/// Settings may change between calls (set_settings, set_bits: e.g. from the adaptive
/// assignment of adaptive.hpp); they must be the same on every rank at each call, which
/// collective checking verifies. The workspace is sized at construction for the larger
/// of the initial settings and all-uncompressed, and grows (reallocates) only when new
/// settings need more. Construction and every call are collective.
template <class T, class X, class Rounding = quant::stochastic>
class layerwise_plan : public detail::layerwise_base<layerwise_plan<T, X, Rounding>, T, X, detail::host_codec<T>> {
  static_assert(quant::is_rounding_v<Rounding>,
                "cgx::layerwise_plan: Rounding must be cgx::quant::stochastic or cgx::quant::nearest");
  static_assert(transport<X>, "cgx::layerwise_plan: X must be a transport (e.g. cgx::comm::mpi)");
  using base = detail::layerwise_base<layerwise_plan<T, X, Rounding>, T, X, detail::host_codec<T>>;
  friend base;

 public:
  /// Collective. A plan for a fused buffer of n values holding `layers`, starting from
  /// default_settings(layers, opts.defaults). Throws cgx::error(errc::invalid_argument)
  /// for layers outside [0, n) or overlapping, or defaults outside the compiled set.
  layerwise_plan(X transport, std::size_t n, std::vector<layer> layers, layerwise_options opts = {})
      : base(std::move(transport), n, std::move(layers), opts) {
    if (this->opts_.error_feedback) {
      try {
        ef_ = error_feedback<T>(n, this->opts_.error_feedback_decay);
      } catch (const std::bad_alloc&) {
        throw error(errc::workspace, "layerwise_plan: cannot allocate the error-feedback residuals of " +
                                         std::to_string(n) + " values");
      }
    }
    this->init();
  }
  layerwise_plan(const layerwise_plan&) = delete;
  layerwise_plan& operator=(const layerwise_plan&) = delete;
  /// Frees the workspace (kept instead if a failed call left a send MPI may still read).
  ~layerwise_plan() { detail::release_workspace(this->x_, ws_); }

  /// Sums buf[0..n) over all ranks, in place, blocking, layer by layer as set. Collective:
  /// every rank calls it with the same n and the same settings. Throws cgx::error,
  /// leaving buf untouched, for a null buf, n != size(), or (collective checking)
  /// layouts or settings that differ between ranks, on every rank; errc::invalid_argument
  /// at once, before any communication, when another thread is in a call of this plan.
  void operator()(T* buf, std::size_t n) {
    const detail::call_guard claimed(this->busy_, "layerwise_plan");
    this->check(buf, n);
    claimed.begin(this->x_, this->sig_, n);
    run(buf, this->next_rng());
    claimed.finish();
  }

  /// Compressed reduce-scatter, in place, blocking: the first phase of operator()'s
  /// schedule alone, half its bytes. Sums buf[0..n) over all ranks and leaves this rank's
  /// chunk of the sum (the values of layout().pieces(rank()); a buffer laid out as
  /// size() layers of equal size, one per rank in offset order, gives rank r layer r)
  /// in buf: this rank's own values exact plus the others' compressed with their layers'
  /// settings (not re-quantized: within the sum of their errors, tighter than
  /// operator()'s bound). The rest of buf is left unspecified (with error feedback it holds
  /// the decoded values this rank sent). Collective, with the same n and settings;
  /// errors as operator(). A rank in reduce_scatter and another in operator() for the
  /// same call get errc::mismatch (collective checking) or a transport mismatch.
  void reduce_scatter(T* buf, std::size_t n) {
    const detail::call_guard claimed(this->busy_, "layerwise_plan::reduce_scatter");
    const std::int64_t sig = this->sig_ ^ 0x5253;  // "RS"
    this->check(buf, n, sig);
    claimed.begin(this->x_, sig, n);
    const quant::rng_state rng = this->next_rng();
    const int p = this->x_.size();
    if (p > 1 && this->layout_.size() != 0) {
      const quant::host_exec ex{this->opts_.threads};
      const std::size_t nrecv = scatter_add(buf, rng, ex, base::pattern(p, slot_));
      this->x_.wait_all(std::span(reqs_.data() + nrecv, reqs_.size() - nrecv));
    }
    claimed.finish();
  }
  /// Bytes this rank sends per reduce_scatter with the current settings (0 on one rank).
  std::size_t reduce_scatter_bytes_sent() const { return this->scatter_bytes_sent(); }

  /// Forgets the error-feedback residuals (no-op without error feedback).
  void reset_error_feedback() { ef_.reset(); }
  /// The error-feedback state; empty (size() 0) without error feedback.
  const error_feedback<T>& feedback() const noexcept { return ef_; }
  /// Replaces this rank's error-feedback residuals (e.g. feedback().residual() saved
  /// with a checkpoint; with set_settings and set_calls a resumed run reduces with the
  /// bits the uninterrupted one would have). Local. Throws cgx::error(errc::invalid_argument),
  /// keeping the old residuals, without error feedback, for a wrong size or a value that
  /// is not finite, and when another thread is in a call of this plan.
  void set_feedback(std::span<const T> residual) {
    const detail::call_guard claimed(this->busy_, "layerwise_plan::set_feedback");
    if (ef_.size() == 0 && !residual.empty())
      throw error(errc::invalid_argument, "layerwise_plan: set_feedback on a plan without error feedback");
    ef_.assign(residual);
  }
  /// Bytes of workspace held.
  std::size_t workspace_size() const noexcept { return ws_bytes_; }

 private:
  static constexpr std::size_t piece_align = 1;
  static constexpr std::uint64_t rounding_id = std::is_same_v<Rounding, quant::stochastic> ? 1 : 0;
  /// The kernels of one setting: with error feedback nearest rounding, whatever Rounding
  /// (error_feedback.hpp: its residual stays bounded only with a deterministic encoding).
  detail::host_codec<T> make_codec(const layer_setting& s) const {
    if (this->opts_.error_feedback) return detail::make_host_codec<T, quant::nearest>(s);
    return detail::make_host_codec<T, Rounding>(s);
  }

  void reserve(std::size_t slot) {
    const int p = this->x_.size();
    const std::size_t need = detail::sized("layerwise_plan", this->size(), p, [&] {
      return detail::checked_mul(base::pattern(p, slot).slots_used(), slot);
    });
    if (need > ws_bytes_) {
      ws_ = detail::allocate_workspace(need, "layerwise_plan", this->size(), p);
      ws_bytes_ = need;
    }
    slot_ = slot;
  }
  /// Compresses rank me's contribution to chunk o of buf into out, piece by piece with
  /// the pattern's keys; with error feedback, through the residuals.
  void compress_chunk(T* buf, int o, std::byte* out, const schedule::sra_pattern& d, int me, const quant::rng_state& rng,
                      quant::host_exec ex) {
    for (const auto& pc : this->layout_.pieces(o)) {
      const quant::rng_state s = schedule::keyed(rng, d.contribution_key(me, comm::chunk{pc.begin, pc.count}));
      if (ef_.size())
        ef_quantize(buf, pc, out + pc.offset, s, ex);
      else
        this->codecs_[pc.layer].compress(buf + pc.begin, pc.count, out + pc.offset, s, ex);
    }
  }

  /// Error-feedback quantization of one piece into o; buf's piece then holds the decoded values.
  void ef_quantize(T* buf, const layerwise_layout::piece& pc, std::byte* o, const quant::rng_state& s,
                   quant::host_exec ex) {
    const auto& c = this->codecs_[pc.layer];
    if (c.lossless) {
      ef_.compensate(buf, pc.begin, pc.count);
      c.compress(buf + pc.begin, pc.count, o, s, ex);
      ef_.clear(pc.begin, pc.count);
      return;
    }
    const auto& st = this->settings_[pc.layer];
    ef_.quantize(buf, pc.begin, pc.count, st.bucket, st.bits,
                 [&](const T* in, std::size_t k) { c.compress(in, k, o, s, ex); },
                 [&](T* y, std::size_t k) { c.decompress(o, k, y, ex); });
  }

  /// Phase 1, scatter-reduce, one message per peer: compresses and sends this rank's part
  /// of every other chunk, receives the others' parts of its own and adds them into buf.
  /// Returns how many of reqs_ were receives (the sends after them are still pending).
  std::size_t scatter_add(T* buf, const quant::rng_state& rng, quant::host_exec ex, const schedule::sra_pattern& d) {
    const int p = this->x_.size(), me = this->x_.rank();
    std::byte* ws = ws_.get();
    const std::size_t mine_bytes = this->layout_.chunk_bytes(me);
    reqs_.clear();
    if (mine_bytes != 0)
      for (int r = 0; r < p; ++r)
        if (r != me) reqs_.push_back(this->x_.irecv(ws + d.recv_slot(r), mine_bytes, r, base::tag_scatter));
    const std::size_t nrecv = reqs_.size();  // rank r's part is reqs_[r - (r > me)]
    for (int step = 1; step < p; ++step) {
      const int o = d.to(me, step);
      if (this->layout_.chunk_bytes(o) == 0) continue;
      compress_chunk(buf, o, ws + d.send_slot(o), d, me, rng, ex);
      reqs_.push_back(this->x_.isend(ws + d.send_slot(o), this->layout_.chunk_bytes(o), o, base::tag_scatter));
    }
    if (mine_bytes != 0) {
      for (int i = 0; i + 1 < p; ++i) {
        const int r = d.addend(me, i);
        this->x_.wait_all(std::span(reqs_.data() + (r - (r > me ? 1 : 0)), 1));
        for (const auto& pc : this->layout_.pieces(me))
          this->codecs_[pc.layer].decompress_add(ws + d.recv_slot(r) + pc.offset, pc.count, buf + pc.begin, ex);
      }
    }
    return nrecv;
  }

  void run(T* buf, const quant::rng_state& rng) {
    const int p = this->x_.size(), me = this->x_.rank();
    if (p == 1 || this->layout_.size() == 0) return;
    const quant::host_exec ex{this->opts_.threads};
    const schedule::sra_pattern d = base::pattern(p, slot_);
    std::byte* ws = ws_.get();
    const std::size_t mine_bytes = this->layout_.chunk_bytes(me);

    // Phase 1: scatter-reduce, one message per peer.
    const std::size_t nrecv = scatter_add(buf, rng, ex, d);
    std::byte* sum = ws + d.send_slot(me);
    if (mine_bytes != 0) {
      // The sum is quantized once; the owner keeps the decoded bytes, like everyone else.
      for (const auto& pc : this->layout_.pieces(me)) {
        const auto& c = this->codecs_[pc.layer];
        const quant::rng_state s = schedule::keyed(rng, d.sum_key(me, comm::chunk{pc.begin, pc.count}));
        std::byte* o = sum + pc.offset;
        if (ef_.size()) {
          ef_quantize(buf, pc, o, s, ex);
          // contributions only: the sum's error is dropped (what the owned chunk carries in is
          // this rank's own, e.g. a contribution's residual from before a change of layout)
          if (!this->opts_.error_feedback_sum) ef_.clear(pc.begin, pc.count);
          continue;
        }
        c.compress(buf + pc.begin, pc.count, o, s, ex);
        if (!c.lossless) c.decompress(o, pc.count, buf + pc.begin, ex);
      }
    }

    // Phase 2: allgather of the compressed sums, received into the receive slots.
    for (int r = 0; r < p; ++r)
      if (r != me && this->layout_.chunk_bytes(r) != 0)
        reqs_.push_back(this->x_.irecv(ws + d.gather_slot(r), this->layout_.chunk_bytes(r), r, base::tag_gather));
    if (mine_bytes != 0)
      for (int step = 1; step < p; ++step) reqs_.push_back(this->x_.isend(sum, mine_bytes, d.to(me, step), base::tag_gather));
    this->x_.wait_all(std::span(reqs_.data() + nrecv, reqs_.size() - nrecv));
    for (int step = 1; step < p; ++step) {
      const int o = d.from(me, step);
      for (const auto& pc : this->layout_.pieces(o))
        this->codecs_[pc.layer].decompress(ws + d.gather_slot(o) + pc.offset, pc.count, buf + pc.begin, ex);
    }
  }

  error_feedback<T> ef_;
  std::unique_ptr<std::byte[]> ws_;
  std::size_t ws_bytes_ = 0;
  std::size_t slot_ = 0;
  std::vector<typename X::request> reqs_;
};

}  // namespace cgx
