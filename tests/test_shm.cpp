// The shared-memory transport: messages larger than its rings, FIFO matching per
// pair, nothing left in /dev/shm, bad arguments.
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <dirent.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "mpi_test_util.hpp"

namespace {
using namespace cgx_test;

// Names under /dev/shm that a cgx transport of this job (rank 0's pid) would use.
int cgx_segments_of(int pid) {
  const std::string prefix = "cgx." + std::to_string(pid) + ".";
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
