#pragma once
// A transport whose "ranks" are threads of one process: lets GPU tests run cgx's
// collectives without MPI (GPU machines may lack it). Models cgx::transport: isend
// copies the message into a mailbox at once; a receive completes in wait_all when its
// message (same source, tag) has arrived, in sending order; max_all is a barrier.
#include <cgx/concepts.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace gpu_test {

/// The shared state of a group of p thread-ranks.
struct thread_group {
  explicit thread_group(int ranks) : p(ranks) {}
  int p;
  std::mutex m;
  std::condition_variable cv;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<std::byte>>> box;  // (src, dst, tag)
  std::vector<std::int64_t> acc, result;
  int arrived = 0;
  std::uint64_t generation = 0;
};

class thread_transport {
 public:
  struct request {
    void* dst = nullptr;  // null: a send (already complete)
    std::size_t bytes = 0;
    int src = -1, tag = 0;
  };

  thread_transport(std::shared_ptr<thread_group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const { return rank_; }
  int size() const { return g_->p; }

  request isend(const void* p, std::size_t bytes, int peer, int tag) {
    std::vector<std::byte> msg(bytes);
    if (bytes != 0) std::memcpy(msg.data(), p, bytes);
    {
      std::lock_guard<std::mutex> l(g_->m);
      g_->box[{rank_, peer, tag}].push_back(std::move(msg));
    }
    g_->cv.notify_all();
    return {};
  }

  request irecv(void* p, std::size_t bytes, int peer, int tag) { return {p, bytes, peer, tag}; }

  void wait_all(std::span<request> reqs) {
    for (auto& q : reqs) {
      if (q.dst == nullptr) continue;
      std::unique_lock<std::mutex> l(g_->m);
      auto& d = g_->box[{q.src, rank_, q.tag}];
      g_->cv.wait(l, [&] { return !d.empty(); });
      if (d.front().size() != q.bytes) throw std::runtime_error("thread_transport: message of unexpected size");
      if (q.bytes != 0) std::memcpy(q.dst, d.front().data(), q.bytes);
      d.pop_front();
      q.dst = nullptr;
    }
  }

  void max_all(std::span<std::int64_t> v) {
    std::unique_lock<std::mutex> l(g_->m);
    const std::uint64_t gen = g_->generation;
    if (g_->arrived == 0)
      g_->acc.assign(v.begin(), v.end());
    else
      for (std::size_t i = 0; i < v.size(); ++i) g_->acc[i] = std::max(g_->acc[i], v[i]);
    if (++g_->arrived == g_->p) {
      g_->result = g_->acc;
      g_->arrived = 0;
      ++g_->generation;
      g_->cv.notify_all();
    } else {
      g_->cv.wait(l, [&] { return g_->generation != gen; });
    }
    std::copy(g_->result.begin(), g_->result.end(), v.begin());
  }

 private:
  std::shared_ptr<thread_group> g_;
  int rank_;
};

static_assert(cgx::transport<thread_transport>);

}  // namespace gpu_test
