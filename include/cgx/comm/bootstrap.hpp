#pragma once
/// \file bootstrap.hpp
/// The `bootstrap` concept: what a transport needs from its process group to *set up*
/// (exchange handles, agree on a failure) and to rendezvous, and nothing more. A
/// bootstrap moves only small host blobs; the payload of a collective never goes
/// through it.
///
/// Implementations:
///  - `comm::mpi_bootstrap` (comm/mpi_bootstrap.hpp): over a duplicated MPI communicator;
///  - `comm::socket_bootstrap` (comm/fork_group.hpp): processes of one node made by
///    `comm::run_forked` (fork + AF_UNIX socketpairs), no MPI at all; every blocking
///    call has a timeout, so a dead peer turns into a cgx::error, never a hang.
///
/// Transports that set up through a bootstrap (comm::cuda_ipc) take any type that
/// models the concept, and any "source" that `bootstrap_from` turns into one (an
/// MPI_Comm, when comm/mpi_bootstrap.hpp is included).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace cgx::comm {

/// B is a bootstrap: a group of `size()` processes, this one being `rank()`, with
///  - `allgather(mine, all)`: collective; every rank passes a blob of the same length m
///    and `all` of p * m bytes; on return `all` holds rank r's blob at [r * m, (r+1) * m)
///    on every rank;
///  - `barrier()`: collective; no rank returns before every rank has entered;
///  - `same_node()`: collective; true on every rank when all ranks run on one node.
/// Every rank makes the same collective calls in the same order. Failures (a dead peer,
/// a timeout, a mismatch of lengths) throw cgx::error(errc::transport).
template <class B>
concept bootstrap = requires(B& b, const B& cb, std::span<const std::byte> mine, std::span<std::byte> all) {
  { cb.rank() } -> std::convertible_to<int>;
  { cb.size() } -> std::convertible_to<int>;
  b.allgather(mine, all);
  b.barrier();
  { b.same_node() } -> std::convertible_to<bool>;
};

/// Turns a value of type C (e.g. an MPI_Comm) into a bootstrap: specializations provide
/// `static auto make(C)`. The primary template provides none.
template <class C>
struct bootstrap_from {};

/// C is something `bootstrap_from<C>::make` turns into a bootstrap.
template <class C>
concept bootstrap_source = requires(C c) {
  { bootstrap_from<C>::make(c) } -> bootstrap;
};

/// Collective over `b`: the element-wise maximum of `v` over all ranks, in place (every
/// rank passes the same number of values). `all` is the gather's buffer, kept by a
/// caller that calls this once per call (no allocation after the first).
template <bootstrap B>
void max_all(B& b, std::span<std::int64_t> v, std::vector<std::byte>& all) {
  const std::size_t m = v.size_bytes();
  const auto p = static_cast<std::size_t>(b.size());
  all.resize(p * m);
  b.allgather(std::as_bytes(v), std::span<std::byte>(all));
  for (std::size_t r = 0; r < p; ++r)
    for (std::size_t i = 0; i < v.size(); ++i) {
      std::int64_t x = 0;
      std::memcpy(&x, all.data() + r * m + i * sizeof x, sizeof x);
      if (x > v[i]) v[i] = x;
    }
}

/// max_all with a buffer of its own (set-up steps).
template <bootstrap B>
void max_all(B& b, std::span<std::int64_t> v) {
  std::vector<std::byte> all;
  max_all(b, v, all);
}

/// Any bootstrap behind one type (for transports that are not templates, such as
/// comm::cuda_ipc). Move-only; holds the bootstrap it was made from. Models `bootstrap`.
class any_bootstrap {
 public:
  /// Empty: holds no bootstrap (only moved-to or destroyed).
  any_bootstrap() = default;
  /// Holds `b` (moved or copied in).
  template <class B>
    requires(bootstrap<std::remove_cvref_t<B>> && !std::is_same_v<std::remove_cvref_t<B>, any_bootstrap>)
  explicit any_bootstrap(B&& b) : p_(std::make_unique<model<std::remove_cvref_t<B>>>(std::forward<B>(b))) {}

  /// True when it holds a bootstrap.
  explicit operator bool() const noexcept { return p_ != nullptr; }
  /// This process's rank (it must hold a bootstrap).
  [[nodiscard]] int rank() const { return p_->rank(); }
  /// Number of ranks (it must hold a bootstrap).
  [[nodiscard]] int size() const { return p_->size(); }
  /// Collective: the held bootstrap's allgather.
  void allgather(std::span<const std::byte> mine, std::span<std::byte> all) { p_->allgather(mine, all); }
  /// Collective: the held bootstrap's barrier.
  void barrier() { p_->barrier(); }
  /// Collective: the held bootstrap's same_node.
  [[nodiscard]] bool same_node() { return p_->same_node(); }

 private:
  struct iface {
    iface() = default;
    iface(const iface&) = delete;
    iface& operator=(const iface&) = delete;
    virtual ~iface() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual void allgather(std::span<const std::byte> mine, std::span<std::byte> all) = 0;
    virtual void barrier() = 0;
    virtual bool same_node() = 0;
  };
  template <class B>
  struct model final : iface {
    template <class A>
    explicit model(A&& a) : b(std::forward<A>(a)) {}
    int rank() const override { return static_cast<int>(b.rank()); }
    int size() const override { return static_cast<int>(b.size()); }
    void allgather(std::span<const std::byte> mine, std::span<std::byte> all) override { b.allgather(mine, all); }
    void barrier() override { b.barrier(); }
    bool same_node() override { return static_cast<bool>(b.same_node()); }
    B b;
  };
  std::unique_ptr<iface> p_;
};

/// `source` as an any_bootstrap: a bootstrap taken over, or a bootstrap_source (e.g. an
/// MPI_Comm) turned into one by bootstrap_from. What transports that set up through a
/// bootstrap (comm::cuda_ipc, comm::nccl) do with the argument of their constructor.
template <class S>
  requires(bootstrap<S> || bootstrap_source<S>)
any_bootstrap to_bootstrap(S source) {
  if constexpr (bootstrap<S>)
    return any_bootstrap(std::move(source));
  else
    return any_bootstrap(bootstrap_from<S>::make(source));
}

}  // namespace cgx::comm
