#pragma once
/// \file fork_group.hpp
/// A process group with no MPI: `comm::run_forked(n, body)` forks n processes of one
/// node, connected by AF_UNIX socketpairs, and runs `body(socket_bootstrap&)` in each,
/// as rank 0 .. n-1; the calling process only supervises (it forks, waits for every
/// rank with waitpid and returns their exit codes). `comm::socket_bootstrap` models the
/// `bootstrap` concept (comm/bootstrap.hpp), so a transport that sets up through a
/// bootstrap (comm::cuda_ipc) runs on a machine without MPI, e.g. a GPU test machine.
///
/// Why the caller is not a rank: CUDA does not survive fork (a child must not use a
/// context its parent created, and a parent that has initialized CUDA cannot give a
/// working one to its children). The supervisor never touches CUDA, so one program can
/// run groups of 2, 3 and 4 ranks one after the other, and every rank starts clean.
/// Call run_forked from a single-threaded process (before creating threads).
///
/// Topology and protocol: a star around rank 0 (rank 0 holds one socket to each other
/// rank). allgather: every rank r > 0 sends rank 0 a header (sequence number of the
/// call, length) and its blob; rank 0 checks both, then sends every rank the whole
/// result. A barrier is an allgather of nothing. Every wait (poll) is bounded by the
/// group's timeout; EINTR is retried; sends use MSG_NOSIGNAL (a closed peer is an error,
/// not SIGPIPE). On any failure a rank shuts its sockets down, so the peers see the end
/// of their stream at once instead of waiting for the timeout: a failure spreads through
/// the group within one round trip. Later calls throw the first failure again.
///
/// Robustness: sockets are created close-on-exec and each rank closes every end that is
/// not its own; on Linux every rank is killed when the supervisor dies (PR_SET_PDEATHSIG:
/// strictly, when the thread that called run_forked ends); stdio
/// buffers are flushed before forking (no duplicated output) and before each rank's
/// `_exit`. A rank whose body throws prints the error on stderr and exits 1.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "bootstrap.hpp"

namespace cgx::comm {

/// A bootstrap over connected stream sockets of one node (see the file comment), made
/// by run_forked. Copies share one channel (like one MPI communicator, not a duplicate):
/// collective calls through all copies are made in the same order on every rank; each
/// message carries the call's sequence number, so a rank out of step is an error, not a
/// misdelivery. The sockets are closed with the last copy.
class socket_bootstrap {
 public:
  /// Rank `rank` of `size`, with `fds[r]` a connected stream socket to rank r: rank 0
  /// needs one to every rank, the others only fds[0] (the rest -1). Takes ownership of
  /// the descriptors. `timeout` bounds every wait of every call (at least 1 ms).
  socket_bootstrap(int rank, int size, std::vector<int> fds, std::chrono::milliseconds timeout)
      : s_(std::make_shared<state>()) {
    s_->rank = rank;
    s_->size = size;
    s_->fds = std::move(fds);
    s_->timeout = timeout < std::chrono::milliseconds(1) ? std::chrono::milliseconds(1) : timeout;
    if (size < 1 || rank < 0 || rank >= size || s_->fds.size() != static_cast<std::size_t>(size))
      throw cgx::error(errc::invalid_argument, "cgx::comm::socket_bootstrap: rank " + std::to_string(rank) +
                                                   " of " + std::to_string(size) + " with " +
                                                   std::to_string(s_->fds.size()) + " descriptors");
  }

  /// This process's rank.
  [[nodiscard]] int rank() const noexcept { return s_->rank; }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return s_->size; }
  /// The bound of every wait.
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return s_->timeout; }

  /// Collective: rank r's `mine` lands at all[r * m, (r + 1) * m) on every rank, m =
  /// mine.size() (the same on every rank), all.size() == size() * m.
  /// \throws cgx::error(errc::transport) on a dead or late peer (past timeout()), a
  ///         length that differs between ranks, or a rank out of step.
  void allgather(std::span<const std::byte> mine, std::span<std::byte> all) {
    state& s = *s_;
    if (!s.failure.empty()) fail_again();
    const std::size_t m = mine.size();
    const auto p = static_cast<std::size_t>(s.size);
    if (all.size() != p * m)
      fail("allgather: the result holds " + std::to_string(all.size()) + " bytes, not size() * " +
           std::to_string(m));
    const std::uint64_t seq = ++s.seq;
    const auto deadline = std::chrono::steady_clock::now() + s.timeout;
    if (s.size == 1) {
      if (m != 0) std::memcpy(all.data(), mine.data(), m);
      return;
    }
    if (s.rank != 0) {
      send_message(0, seq, mine, deadline);
      recv_message(0, seq, all, deadline);
      return;
    }
    if (m != 0) std::memcpy(all.data(), mine.data(), m);
    for (std::size_t r = 1; r < p; ++r) recv_message(static_cast<int>(r), seq, all.subspan(r * m, m), deadline);
    for (std::size_t r = 1; r < p; ++r) send_message(static_cast<int>(r), seq, all, deadline);
  }

  /// Collective: returns once every rank has entered. \throws as allgather().
  void barrier() { allgather({}, {}); }

  /// Always true: AF_UNIX sockets connect processes of one kernel only. Collective in
  /// name only: it sends nothing.
  [[nodiscard]] bool same_node() const noexcept { return true; }

 private:
  struct header {
    std::uint64_t magic;
    std::uint64_t seq;
    std::uint64_t bytes;
  };
  static constexpr std::uint64_t magic_value = 0x6367782d626f6f74ull;  // "cgx-boot"

  struct state {
    int rank = 0;
    int size = 1;
    std::vector<int> fds;
    std::chrono::milliseconds timeout{60000};
    std::uint64_t seq = 0;
    std::string failure;
    state() = default;
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      for (int fd : fds)
        if (fd >= 0) (void)::close(fd);
    }
  };

  [[noreturn]] void fail(const std::string& what) {
    state& s = *s_;
    if (s.failure.empty()) s.failure = what;
    // Tell the peers now: they see the end of their stream instead of waiting.
    for (int fd : s.fds)
      if (fd >= 0) (void)::shutdown(fd, SHUT_RDWR);
    throw cgx::error(errc::transport, "cgx::comm::socket_bootstrap (rank " + std::to_string(s.rank) + " of " +
                                          std::to_string(s.size) + "): " + what);
  }

  [[noreturn]] void fail_again() { fail("an earlier call failed: " + s_->failure); }

  /// Waits until fd is ready for `events`, up to the deadline; retries on EINTR.
  void wait_fd(int peer, short events, std::chrono::steady_clock::time_point deadline, const char* doing) {
    const int fd = s_->fds[static_cast<std::size_t>(peer)];
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0)
        fail(std::string("timed out after ") + std::to_string(s_->timeout.count()) + " ms " + doing + " rank " +
             std::to_string(peer) + " (is it alive and making the same calls?)");
      pollfd pfd{fd, events, 0};
      const int rc = ::poll(&pfd, 1, left > 1000000 ? 1000000 : static_cast<int>(left));
      if (rc < 0) {
        if (errno == EINTR) continue;
        fail(std::string("poll failed ") + doing + " rank " + std::to_string(peer) + ": " + std::strerror(errno));
      }
      if (rc > 0) return;  // ready, or hung up / in error: the following call tells which
    }
  }

  void send_bytes(int peer, const std::byte* p, std::size_t n, std::chrono::steady_clock::time_point deadline) {
    const int fd = s_->fds[static_cast<std::size_t>(peer)];
    while (n > 0) {
      const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) {
        p += k;
        n -= static_cast<std::size_t>(k);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        wait_fd(peer, POLLOUT, deadline, "sending to");
        continue;
      }
      fail("sending to rank " + std::to_string(peer) + " failed: " +
           (k < 0 ? std::strerror(errno) : "nothing sent") + " (the peer exited or failed)");
    }
  }

  void recv_bytes(int peer, std::byte* p, std::size_t n, std::chrono::steady_clock::time_point deadline) {
    const int fd = s_->fds[static_cast<std::size_t>(peer)];
    while (n > 0) {
      const ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
      if (k > 0) {
        p += k;
        n -= static_cast<std::size_t>(k);
        continue;
      }
      if (k == 0) fail("rank " + std::to_string(peer) + " closed its connection (it exited or failed)");
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        wait_fd(peer, POLLIN, deadline, "receiving from");
        continue;
      }
      fail("receiving from rank " + std::to_string(peer) + " failed: " + std::strerror(errno));
    }
  }

  void send_message(int peer, std::uint64_t seq, std::span<const std::byte> data,
                    std::chrono::steady_clock::time_point deadline) {
    const header h{magic_value, seq, data.size()};
    send_bytes(peer, reinterpret_cast<const std::byte*>(&h), sizeof h, deadline);
    send_bytes(peer, data.data(), data.size(), deadline);
  }

  void recv_message(int peer, std::uint64_t seq, std::span<std::byte> data,
                    std::chrono::steady_clock::time_point deadline) {
    header h{};
    recv_bytes(peer, reinterpret_cast<std::byte*>(&h), sizeof h, deadline);
    if (h.magic != magic_value) fail("garbage from rank " + std::to_string(peer) + " (not a bootstrap message)");
    if (h.seq != seq)
      fail("rank " + std::to_string(peer) + " is at collective call " + std::to_string(h.seq) + ", this rank at " +
           std::to_string(seq) + " (ranks must make the same calls in the same order)");
    if (h.bytes != data.size())
      fail("rank " + std::to_string(peer) + " sent " + std::to_string(h.bytes) + " bytes where " +
           std::to_string(data.size()) + " were expected (allgather blobs must have one length on every rank)");
    recv_bytes(peer, data.data(), data.size(), deadline);
  }

  std::shared_ptr<state> s_;
};

/// Options of run_forked.
struct fork_options {
  /// Bound of every wait inside the ranks' socket_bootstrap calls.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  /// When positive: ranks still running this long after the fork are killed (SIGKILL)
  /// and reported as 128 + 9. Zero: the supervisor waits as long as they run.
  std::chrono::milliseconds wait_limit{0};
};

/// What run_forked's ranks returned.
struct fork_result {
  /// Per rank: its exit code (body's return value, 1 when body threw), 128 + the
  /// signal that killed it, or -1 when waitpid failed (e.g. SIGCHLD set to SIG_IGN).
  std::vector<int> codes;
  /// 0 when every rank returned 0; 77 when every rank returned 77 (skipped); else the
  /// first code of the ranks, in rank order, that is not 0 (or not 77).
  [[nodiscard]] int code() const noexcept {
    bool all77 = !codes.empty();
    for (int c : codes) all77 = all77 && c == 77;
    if (all77) return 77;
    for (int c : codes)
      if (c != 0 && c != 77) return c;
    for (int c : codes)
      if (c != 0) return c;
    return 0;
  }
};

namespace detail {
inline void close_all(std::vector<int>& fds) noexcept {
  for (int& fd : fds)
    if (fd >= 0) {
      (void)::close(fd);
      fd = -1;
    }
}

/// waitpid without EINTR; the exit code, 128 + signal, or -1 when waitpid failed.
inline int reap(pid_t pid, int flags, bool& done) {
  for (;;) {
    int st = 0;
    const pid_t r = ::waitpid(pid, &st, flags);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      done = false;
      return 0;
    }
    done = true;
    if (r < 0) return -1;
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return -1;
  }
}
}  // namespace detail

/// Forks `n` processes (ranks 0 .. n-1) connected as described in the file comment,
/// runs `body(socket_bootstrap&)` in each (it returns the rank's exit code, 0..255),
/// and waits for all of them. The calling process is no rank and returns the ranks'
/// exit codes. Call it from a single-threaded process that has not initialized CUDA.
/// \throws cgx::error(errc::invalid_argument) for n < 1, cgx::error(errc::transport)
///         when a socketpair or fork fails (ranks already forked are killed and reaped).
template <class F>
fork_result run_forked(int n, F&& body, fork_options opt = {}) {
  if (n < 1) throw cgx::error(errc::invalid_argument, "cgx::comm::run_forked: n = " + std::to_string(n) + " < 1");
  // pairs[2 (r - 1)] is rank 0's end of its socket to rank r, pairs[2 (r - 1) + 1] rank r's.
  std::vector<int> pairs;
  for (int r = 1; r < n; ++r) {
    int sv[2] = {-1, -1};
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      const std::string why = std::strerror(errno);
      detail::close_all(pairs);
      throw cgx::error(errc::transport, "cgx::comm::run_forked: socketpair failed: " + why);
    }
    pairs.push_back(sv[0]);
    pairs.push_back(sv[1]);
  }
  std::fflush(nullptr);  // no buffered output duplicated into the children
  const pid_t supervisor = ::getpid();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      const std::string why = std::strerror(errno);
      for (pid_t q : pids) (void)::kill(q, SIGKILL);
      bool done = false;
      for (pid_t q : pids) (void)detail::reap(q, 0, done);
      detail::close_all(pairs);
      throw cgx::error(errc::transport, "cgx::comm::run_forked: fork of rank " + std::to_string(r) + " failed: " + why);
    }
    if (pid == 0) {
#if defined(__linux__)
      (void)::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != supervisor) ::_exit(127);  // the supervisor died before prctl
#endif
      std::vector<int> mine(static_cast<std::size_t>(n), -1);
      for (int q = 1; q < n; ++q) {
        int& zero_end = pairs[static_cast<std::size_t>(2 * (q - 1))];
        int& q_end = pairs[static_cast<std::size_t>(2 * (q - 1) + 1)];
        if (r == 0) std::swap(mine[static_cast<std::size_t>(q)], zero_end);
        if (r == q) std::swap(mine[0], q_end);
      }
      detail::close_all(pairs);
      int code = 1;
      try {
        socket_bootstrap boot(r, n, std::move(mine), opt.timeout);
        code = std::invoke(body, boot);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "cgx::comm::run_forked: rank %d of %d: %s\n", r, n, e.what());
      } catch (...) {
        std::fprintf(stderr, "cgx::comm::run_forked: rank %d of %d: unknown exception\n", r, n);
      }
      std::fflush(nullptr);
      ::_exit(code & 0xff);
    }
    pids.push_back(pid);
  }
  detail::close_all(pairs);
  fork_result res;
  res.codes.assign(static_cast<std::size_t>(n), -1);
  std::vector<bool> reaped(static_cast<std::size_t>(n), false);
  if (opt.wait_limit.count() > 0) {
    const auto until = std::chrono::steady_clock::now() + opt.wait_limit;
    for (;;) {
      bool all = true;
      for (std::size_t r = 0; r < pids.size(); ++r) {
        if (reaped[r]) continue;
        bool done = false;
        const int c = detail::reap(pids[r], WNOHANG, done);
        if (done) {
          reaped[r] = true;
          res.codes[r] = c;
        } else {
          all = false;
        }
      }
      if (all || std::chrono::steady_clock::now() >= until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (std::size_t r = 0; r < pids.size(); ++r)
      if (!reaped[r]) (void)::kill(pids[r], SIGKILL);
  }
  for (std::size_t r = 0; r < pids.size(); ++r) {
    if (reaped[r]) continue;
    bool done = false;
    res.codes[r] = detail::reap(pids[r], 0, done);
  }
  return res;
}

}  // namespace cgx::comm
