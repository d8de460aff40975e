// The shared-memory transport: messages larger than its rings, FIFO matching per
// pair, nothing left in /dev/shm (and stale names of killed jobs reclaimed), bad
// arguments, ring sizes that differ between ranks, a /dev/shm too small for the rings.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>

#include <cstring>
#include <string>
#include <vector>

#include "mpi_test_util.hpp"

namespace {
using namespace cgx_test;

// The inode of this process's pid namespace (what comm::shm puts in its names).
unsigned long long pid_ns() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<unsigned long long>(st.st_ino) : 0;
}

// Names under /dev/shm that a cgx transport of this job (rank 0's pid) would use.
int cgx_segments_of(int pid) {
  const std::string prefix = "cgx." + std::to_string(pid_ns()) + "." + std::to_string(pid) + ".";
  int found = 0;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) ++found;
    closedir(d);
  }
  return found;
}
}  // namespace

TEST_CASE("shm: a message many times the ring size, both directions at once") {
  const int p = world_size();
  const int r = world_rank();
  cgx::comm::shm x{MPI_COMM_WORLD, 4096};
  const std::size_t bytes = 1 << 20;  // 256 rings' worth
  std::vector<std::vector<unsigned char>> in(static_cast<std::size_t>(p)), out(static_cast<std::size_t>(p));
  std::vector<cgx::comm::shm::request> reqs;
  for (int q = 0; q < p; ++q) {
    if (q == r) continue;
    auto& o = out[static_cast<std::size_t>(q)];
    o.resize(bytes);
    for (std::size_t i = 0; i < bytes; ++i) o[i] = static_cast<unsigned char>(mix(i + 977u * static_cast<unsigned>(r * p + q)));
    in[static_cast<std::size_t>(q)].assign(bytes, 0);
    reqs.push_back(x.irecv(in[static_cast<std::size_t>(q)].data(), bytes, q, 0));
    reqs.push_back(x.isend(o.data(), bytes, q, 0));
  }
  x.wait_all(reqs);
  for (int q = 0; q < p; ++q) {
    if (q == r) continue;
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < bytes; ++i)
      wrong += in[static_cast<std::size_t>(q)][i] != static_cast<unsigned char>(mix(i + 977u * static_cast<unsigned>(q * p + r)));
    CHECK(wrong == 0);
  }
}

TEST_CASE("shm: messages between one pair match in posting order, zero-byte ones too") {
  const int p = world_size();
  const int r = world_rank();
  if (p < 2) return;
  cgx::comm::shm x{MPI_COMM_WORLD, 4096};
  const int to = (r + 1) % p, from = (r + p - 1) % p;
  std::vector<int> a(3000, r), b(10, r * 10), ra(3000, -1), rb(10, -1);
  std::vector<cgx::comm::shm::request> q;
  q.push_back(x.irecv(ra.data(), ra.size() * sizeof(int), from, 0));
  q.push_back(x.irecv(nullptr, 0, from, 0));
  q.push_back(x.irecv(rb.data(), rb.size() * sizeof(int), from, 0));
  q.push_back(x.isend(a.data(), a.size() * sizeof(int), to, 0));
  q.push_back(x.isend(nullptr, 0, to, 0));
  q.push_back(x.isend(b.data(), b.size() * sizeof(int), to, 0));
  x.wait_all(q);
  CHECK(ra == std::vector<int>(3000, from));
  CHECK(rb == std::vector<int>(10, from * 10));
}

TEST_CASE("shm: the segment's name is gone from /dev/shm as soon as the transport exists") {
  int pid0 = static_cast<int>(getpid());
  MPI_Bcast(&pid0, 1, MPI_INT, 0, MPI_COMM_WORLD);
  {
    cgx::comm::shm x{MPI_COMM_WORLD};
    CHECK(cgx_segments_of(pid0) == 0);
    std::int64_t v[2] = {world_rank(), -world_rank()};
    x.max_all(v);
    CHECK(v[0] == world_size() - 1);
    CHECK(v[1] == 0);
  }
  CHECK(cgx_segments_of(pid0) == 0);
}

TEST_CASE("shm: bad arguments") {
  CHECK_THROWS_AS(cgx::comm::shm(MPI_COMM_WORLD, 1000), cgx::error);
  CHECK_THROWS_AS(cgx::comm::shm(MPI_COMM_NULL), cgx::error);
  cgx::comm::shm x{MPI_COMM_WORLD};
  int v = 0;
  CHECK_THROWS_AS(x.isend(&v, sizeof(v), world_size(), 0), cgx::error);
}

TEST_CASE("shm: ranks that pass different ring_bytes all throw errc::mismatch") {
  const int p = world_size();
  if (p < 2) return;
  // Before: the constructor succeeded and the first transfer read and wrote past the
  // smaller mapping (SIGBUS).
  const std::size_t ring = world_rank() == 0 ? 8192 : 4096;
  CHECK(error_code_of([&] { cgx::comm::shm x(MPI_COMM_WORLD, ring); }) == cgx::errc::mismatch);
  // A bad ring_bytes on one rank: every rank throws (before: the others hung).
  const std::size_t bad = world_rank() == p - 1 ? 1000 : 4096;
  CHECK(error_code_of([&] { cgx::comm::shm x(MPI_COMM_WORLD, bad); }) == cgx::errc::invalid_argument);
  // The communicator is still usable.
  cgx::comm::shm x{MPI_COMM_WORLD, 4096};
  std::int64_t v[1] = {world_rank()};
  x.max_all(v);
  CHECK(v[0] == p - 1);
}

TEST_CASE("shm: rings larger than /dev/shm are refused at construction, naming /dev/shm and the bytes") {
  // The smallest ring size whose segment exceeds the whole of /dev/shm: the kernel
  // refuses to reserve it at once (nothing is filled). Before: the constructor
  // succeeded and the first transfer into an unbacked page killed the rank (SIGBUS).
  struct statvfs v {};
  REQUIRE(statvfs("/dev/shm", &v) == 0);
  const auto total = static_cast<unsigned long long>(v.f_blocks) * static_cast<unsigned long long>(v.f_frsize);
  const auto pairs = static_cast<unsigned long long>(world_size()) * static_cast<unsigned long long>(world_size());
  std::size_t ring = 4096;
  while (pairs * (ring + 128) + 128 <= total) ring *= 2;  // the rings, and 128 bytes for failure reports
  const std::string need = std::to_string(pairs * (ring + 128) + 128);
  std::string what;
  std::optional<cgx::errc> code;
  try {
    cgx::comm::shm x(MPI_COMM_WORLD, ring);
  } catch (const cgx::error& e) {
    code = e.code();
    what = e.what();
  }
  INFO("ring_bytes " << ring << ", /dev/shm of " << total << " bytes: " << what);
  CHECK(code == cgx::errc::transport);
  CHECK(what.find("/dev/shm") != std::string::npos);
  CHECK(what.find(need) != std::string::npos);
  CHECK(what.find("free") != std::string::npos);
  // Rings that fit still work there.
  cgx::comm::shm x{MPI_COMM_WORLD};
  std::int64_t m[1] = {world_rank()};
  x.max_all(m);
  CHECK(m[0] == world_size() - 1);
}

TEST_CASE("shm: names left by a job killed inside the constructor are reclaimed by the next one") {
  // What a rank 0 killed between creating its segment and unlinking the name leaves:
  // "cgx.<pid ns>.<pid>....". Names of dead creators in this pid namespace go; names
  // of live creators, of other namespaces or of other programs stay.
  const unsigned long long ns = pid_ns();
  if (ns == 0) return;  // no /proc: comm::shm reclaims nothing
  int dead = 0;
  if (world_rank() == 0) {
    for (int pid = 4000000; pid > 100000 && dead == 0; --pid)
      if (kill(pid, 0) != 0 && errno == ESRCH) dead = pid;
  }
  MPI_Bcast(&dead, 1, MPI_INT, 0, MPI_COMM_WORLD);
  REQUIRE(dead != 0);
  const std::string stale = "/cgx." + std::to_string(ns) + "." + std::to_string(dead) + ".1.test";
  const std::string live = "/cgx." + std::to_string(ns) + "." + std::to_string(getppid()) + ".1.test";
  const std::string other_ns = "/cgx." + std::to_string(ns + 1) + "." + std::to_string(dead) + ".1.test";
  auto exists = [](const std::string& n) { return access(("/dev/shm" + n).c_str(), F_OK) == 0; };
  if (world_rank() == 0)
    for (const auto* n : {&stale, &live, &other_ns}) {
      const int fd = shm_open(n->c_str(), O_CREAT | O_RDWR, 0600);
      REQUIRE(fd >= 0);
      close(fd);
    }
  MPI_Barrier(MPI_COMM_WORLD);
  {
    cgx::comm::shm x{MPI_COMM_WORLD, 4096};
  }
  if (world_rank() == 0) {
    CHECK_FALSE(exists(stale));
    CHECK(exists(live));
    CHECK(exists(other_ns));
    for (const auto* n : {&stale, &live, &other_ns}) shm_unlink(n->c_str());
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
