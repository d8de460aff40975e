#pragma once
/// \file store_bootstrap.hpp
/// `comm::store_bootstrap<S>`: the `bootstrap` concept (comm/bootstrap.hpp) over a
/// key-value store that every rank reaches, the way jobs without MPI rendezvous (torch's
/// c10d Store under torchrun, a directory on a shared file system). It lets the device
/// transports (comm::nccl's unique id, comm::cuda_ipc's handles) set up with no MPI.
///
/// The store needs three operations (the `kv_store` concept): `set`, a non-blocking
/// `try_get`, and an atomic `add` that returns the new value. `comm::file_store` is one
/// over a directory; cgx_torch adapts c10d::Store (python/csrc).
///
/// Every step is bounded by a wait limit and ends the same way on every rank: success on
/// all, or cgx::error(errc::timeout) on all, the late rank included (it never succeeds
/// alone after the others gave up). How: each step has an arrival counter. A rank writes
/// its blob, then adds 1; a rank whose limit passes adds a large constant G instead (it
/// "gives up"). The rank whose add made the count of arrivals p is unique and knows
/// whether any give-up came before it (its add returned exactly p) and publishes the
/// outcome; a rank that reads p arrivals and no give-up knows it succeeded; one that
/// reads fewer than p arrivals and a give-up knows it failed; only a rank that reads p
/// arrivals and a give-up waits for the published outcome. Unlike MPI, the store can say
/// which ranks were missing: the error names them.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../timeout.hpp"
#include "bootstrap.hpp"

namespace cgx::comm {

/// S is a key-value store shared by the ranks of a job:
///  - `set(key, bytes)`: stores the value (later readers on any rank see it);
///  - `try_get(key)`: the value, or std::nullopt when the key is not set (never blocks
///    for long);
///  - `add(key, delta)`: atomically adds to the 64-bit counter under `key` (0 when
///    unset) and returns the new value.
/// Failures of the store itself throw (any exception; store_bootstrap lets it through).
template <class S>
concept kv_store = requires(S& s, const std::string& key, std::span<const std::byte> value, std::int64_t delta) {
  s.set(key, value);
  { s.try_get(key) } -> std::same_as<std::optional<std::vector<std::byte>>>;
  { s.add(key, delta) } -> std::convertible_to<std::int64_t>;
};

/// A kv_store in a directory: one file per key (written to a temporary name, then
/// renamed: a reader sees a whole value or none), counters updated under flock(2). Any
/// file system where rename is atomic and flock works (local disks, tmpfs; not every
/// NFS). For jobs without MPI or torch, and for the tests. Copies share the directory.
class file_store {
 public:
  /// Uses `dir` (created if missing, not its parents). \throws cgx::error(errc::transport)
  /// when it cannot be created or is not a directory.
  explicit file_store(std::string dir) : dir_(std::move(dir)) {
    if (dir_.empty()) throw cgx::error(errc::invalid_argument, "cgx::comm::file_store: an empty directory name");
    if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) fail("mkdir " + dir_);
    struct stat st {};
    if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      throw cgx::error(errc::transport, "cgx::comm::file_store: " + dir_ + " is not a directory");
  }

  /// The directory.
  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }

  /// Stores `value` under `key` (replacing an earlier value).
  void set(const std::string& key, std::span<const std::byte> value) {
    static std::atomic<std::uint64_t> unique{0};  // per process; the pid tells processes apart
    const std::string tmp = dir_ + "/.tmp." + std::to_string(::getpid()) + "." + std::to_string(++unique);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) fail("open " + tmp);
    const bool ok = write_all(fd, value);
    const int saved = errno;
    (void)::close(fd);
    errno = saved;
    if (!ok) {
      (void)::unlink(tmp.c_str());
      fail("write " + tmp);
    }
    if (::rename(tmp.c_str(), path(key).c_str()) != 0) {
      (void)::unlink(tmp.c_str());
      fail("rename to " + path(key));
    }
  }

  /// The value under `key`, or std::nullopt.
  [[nodiscard]] std::optional<std::vector<std::byte>> try_get(const std::string& key) const {
    const int fd = ::open(path(key).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return std::nullopt;
      fail("open " + path(key));
    }
    std::vector<std::byte> out;
    std::byte buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int saved = errno;
        (void)::close(fd);
        errno = saved;
        fail("read " + path(key));
      }
      if (n == 0) break;
      out.insert(out.end(), buf, buf + n);
    }
    (void)::close(fd);
    return out;
  }

  /// Adds `delta` to the counter under `key` (0 when unset) and returns the new value.
  std::int64_t add(const std::string& key, std::int64_t delta) {
    const std::string p = path(key) + ".counter";
    const int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) fail("open " + p);
    struct closer {
      int fd;
      ~closer() { (void)::close(fd); }  // also releases the lock
    } c{fd};
    while (::flock(fd, LOCK_EX) != 0)
      if (errno != EINTR) fail("flock " + p);
    std::int64_t v = 0;
    const ssize_t n = ::pread(fd, &v, sizeof v, 0);
    if (n != 0 && n != static_cast<ssize_t>(sizeof v)) fail("pread " + p);
    v += delta;
    if (::pwrite(fd, &v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) fail("pwrite " + p);
    return v;
  }

 private:
  // Keys may hold '/' and other characters a file name cannot: every byte outside
  // [A-Za-z0-9_-] becomes %XX.
  [[nodiscard]] std::string path(const std::string& key) const {
    static constexpr char hex[] = "0123456789abcdef";
    std::string name = dir_ + "/k_";
    for (unsigned char ch : key) {
      if (std::isalnum(ch) != 0 || ch == '_' || ch == '-') {
        name += static_cast<char>(ch);
      } else {
        name += '%';
        name += hex[ch >> 4];
        name += hex[ch & 15];
      }
    }
    return name;
  }
  static bool write_all(int fd, std::span<const std::byte> v) {
    std::size_t done = 0;
    while (done < v.size()) {
      const ssize_t n = ::write(fd, v.data() + done, v.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<std::size_t>(n);
    }
    return true;
  }
  [[noreturn]] static void fail(const std::string& what) {
    throw cgx::error(errc::transport, "cgx::comm::file_store: " + what + " failed: " + std::strerror(errno));
  }

  std::string dir_;
};

/// A bootstrap over a kv_store: rank `rank` of `size`, its keys under `prefix`. Ranks of
/// one group pass the same store, size and prefix, and distinct ranks 0 .. size-1 (what a
/// rendezvous such as torchrun's gives). Two bootstraps alive at once on one store need
/// distinct prefixes. Move-only (its step counter names the keys).
template <kv_store S>
class store_bootstrap {
 public:
  /// Collective: a first step (a barrier) checks that every rank joined within `limit`
  /// (default: default_timeout_ms(), CGX_TIMEOUT_MS or 10 minutes; zero: no limit).
  /// \throws cgx::error(errc::invalid_argument) for a rank outside [0, size) or an empty
  ///         prefix, errc::timeout as barrier().
  store_bootstrap(S store, int rank, int size, std::string prefix,
                  std::chrono::milliseconds limit = std::chrono::milliseconds(default_timeout_ms()))
      : store_(std::move(store)), rank_(rank), size_(size), prefix_(std::move(prefix)), limit_(limit) {
    if (size < 1 || rank < 0 || rank >= size || prefix_.empty())
      throw cgx::error(errc::invalid_argument, "cgx::comm::store_bootstrap: rank " + std::to_string(rank) + " of " +
                                                   std::to_string(size) + ", prefix '" + prefix_ + "'");
    barrier();
  }
  /// Takes over o's store and step count (o is left for destruction only).
  store_bootstrap(store_bootstrap&& o) noexcept = default;
  /// Takes over o's store and step count (o is left for destruction only).
  store_bootstrap& operator=(store_bootstrap&& o) noexcept = default;
  store_bootstrap(const store_bootstrap&) = delete;
  store_bootstrap& operator=(const store_bootstrap&) = delete;
  ~store_bootstrap() = default;

  /// This process's rank.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return size_; }
  /// The bound of every step (zero: none).
  [[nodiscard]] std::chrono::milliseconds limit() const noexcept { return limit_; }

  /// Collective: rank r's `mine` lands at all[r * m, (r + 1) * m) on every rank, m =
  /// mine.size(). \throws cgx::error(errc::timeout) on every rank when some rank did not
  /// come within the limit (naming the ranks that had not), the late rank included;
  /// errc::transport on every rank when the lengths differ between ranks;
  /// errc::invalid_argument when all.size() != size() * m (this rank only, before it
  /// joins the step: the others then time out).
  void allgather(std::span<const std::byte> mine, std::span<std::byte> all) {
    const std::size_t m = mine.size();
    const auto p = static_cast<std::size_t>(size_);
    if (all.size() != p * m)
      throw cgx::error(errc::invalid_argument, "cgx::comm::store_bootstrap: allgather's result holds " +
                                                   std::to_string(all.size()) + " bytes, not size() * " +
                                                   std::to_string(m));
    const std::uint64_t step = ++step_;
    const std::string base = prefix_ + "/" + std::to_string(step) + "/";
    // The blob, with the step and its length first (checked by every reader).
    std::vector<std::byte> v(2 * sizeof(std::uint64_t) + m);
    const std::uint64_t head[2] = {step, m};
    std::memcpy(v.data(), head, sizeof head);
    if (m != 0) std::memcpy(v.data() + sizeof head, mine.data(), m);
    store_.set(base + std::to_string(rank_), v);
    arrive(base, step);
    for (std::size_t r = 0; r < p; ++r) {
      auto got = store_.try_get(base + std::to_string(r));
      std::uint64_t h[2] = {0, 0};
      if (got && got->size() >= sizeof h) std::memcpy(h, got->data(), sizeof h);
      if (!got || h[0] != step || got->size() != sizeof h + h[1])
        throw cgx::error(errc::transport, where(step) + "rank " + std::to_string(r) + "'s blob is missing or malformed");
      if (h[1] != m)
        throw cgx::error(errc::transport, where(step) + "rank " + std::to_string(r) + " passed " +
                                              std::to_string(h[1]) + " bytes, rank " + std::to_string(rank_) + " " +
                                              std::to_string(m) + " (allgather blobs have one length on every rank)");
      if (m != 0) std::memcpy(all.data() + r * m, got->data() + sizeof h, m);
    }
  }

  /// Collective: returns once every rank has entered. \throws as allgather().
  void barrier() { allgather({}, {}); }

  /// Collective: true on every rank when every rank runs on one node (one host name and
  /// one boot of one kernel: /proc/sys/kernel/random/boot_id). \throws as allgather().
  [[nodiscard]] bool same_node() {
    std::string id = host_id();
    id.resize(node_id_bytes, '\0');
    std::vector<std::byte> all(node_id_bytes * static_cast<std::size_t>(size_));
    allgather(std::as_bytes(std::span<const char>(id.data(), id.size())), all);
    for (int r = 1; r < size_; ++r)
      if (std::memcmp(all.data(), all.data() + static_cast<std::size_t>(r) * node_id_bytes, node_id_bytes) != 0)
        return false;
    return true;
  }

 private:
  static constexpr std::int64_t gave_up = std::int64_t{1} << 32;  // G of the file comment
  static constexpr std::size_t node_id_bytes = 128;

  [[nodiscard]] std::string where(std::uint64_t step) const {
    return "cgx::comm::store_bootstrap (rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
           ", keys '" + prefix_ + "/" + std::to_string(step) + "/'): ";
  }

  // Joins the step's counter and waits for its outcome (see the file comment).
  void arrive(const std::string& base, std::uint64_t step) {
    const std::string count = base + "n";
    const std::string outcome = base + "outcome";
    const std::int64_t p = size_;
    std::int64_t v = store_.add(count, 1);
    if (v % gave_up == p) {  // this rank's arrival made p: it alone knows and tells
      const bool ok = v == p;
      const std::byte b{static_cast<unsigned char>(ok ? 1 : 0)};
      store_.set(outcome, std::span<const std::byte>(&b, 1));
      if (!ok) throw late(base, step);
      return;
    }
    if (v >= gave_up) throw late(base, step);  // fewer than p arrivals and a give-up: failed
    const auto start = std::chrono::steady_clock::now();
    auto pause = std::chrono::microseconds(100);
    for (;;) {
      if (v == p) return;
      if (v >= gave_up) break;  // p arrivals and a give-up (fewer: failed, below)
      if (limit_.count() > 0 && std::chrono::steady_clock::now() - start >= limit_) {
        v = store_.add(count, gave_up);
        if (v % gave_up < p) throw timed_out(base, step);
        break;  // every rank had come before this give-up: the outcome decides
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(20000));
      v = store_.add(count, 0);
    }
    if (v % gave_up < p) throw late(base, step);
    // p arrivals and a give-up: the p-th arrival's rank publishes the outcome right after
    // its add; wait for it (bounded: that rank may have died in between).
    const auto until = std::chrono::steady_clock::now() + std::max(limit_, std::chrono::milliseconds(1000));
    pause = std::chrono::microseconds(100);
    for (;;) {
      if (auto o = store_.try_get(outcome); o && o->size() == 1) {
        if ((*o)[0] == std::byte{1}) return;
        throw late(base, step);
      }
      if (std::chrono::steady_clock::now() >= until)
        throw cgx::error(errc::timeout, where(step) + "every rank arrived, but the last one did not publish the "
                                                      "step's outcome (it died?)");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(20000));
    }
  }

  // The ranks whose blob of the step is not in the store.
  [[nodiscard]] std::string missing(const std::string& base) {
    std::string out;
    for (int r = 0; r < size_; ++r)
      if (!store_.try_get(base + std::to_string(r))) out += (out.empty() ? "" : ", ") + std::to_string(r);
    return out;
  }

  // The step failed: a peer gave up (this rank did not).
  [[nodiscard]] cgx::error late(const std::string& base, std::uint64_t step) {
    const std::string m = missing(base);
    if (m.empty())
      return cgx::error(errc::timeout, where(step) +
                                           "a peer gave up waiting for the others in this step before this rank arrived "
                                           "(its wait limit passed); the step failed on every rank");
    return cgx::error(errc::timeout, where(step) + "a peer gave up waiting for rank(s) " + m +
                                         " to join (its wait limit passed; late, skipped the collective set-up, or "
                                         "died); the step failed on every rank");
  }

  // The step failed: this rank gave up.
  [[nodiscard]] cgx::error timed_out(const std::string& base, std::uint64_t step) {
    const std::string m = missing(base);
    return cgx::error(errc::timeout, where(step) + "waited more than " + std::to_string(limit_.count()) +
                                         " ms (CGX_TIMEOUT_MS or the given limit) for rank(s) " +
                                         (m.empty() ? std::string("?") : m) +
                                         " to join (late, skipped the collective set-up, or died)");
  }

  static std::string host_id() {
    char host[256] = {};
    (void)::gethostname(host, sizeof host - 1);
    std::string boot;
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::getline(f, boot);
    return std::string(host) + "\n" + boot;
  }

  S store_;
  int rank_ = 0;
  int size_ = 1;
  std::string prefix_;
  std::chrono::milliseconds limit_{0};
  std::uint64_t step_ = 0;
};

}  // namespace cgx::comm
