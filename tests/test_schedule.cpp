// The schedule descriptions (include/cgx/schedule/) on their own, one process: for
// p = 1..8 (hierarchical: N x L nodes) and awkward counts, every rank ends with every
// value exactly once, every send has its receive on the peer (same phase, step, values
// and size, in the same order per pair), no two compressions of the same values share a
// random stream, positions are the values' indices, every finished sum is compressed
// exactly once, bytes sent from the workspace were put there first, and the workspace
// holds every message (SRA: in the slots its form uses). And the executors of comm/
// (SRA both forms, ring, tree, uncompressed), run rank by rank over a recording
// transport and codec, post exactly the messages (order, peer, size, workspace offset)
// and compressions (values, stream, position, offset) their descriptions list; hierarchical likewise for its own messages
// (node, cross, back, share) on N x L layouts. SRA's cut-free part (sra_pattern) alone
// too, and with layerwise_plan's keys over a layer-wise cut.
#include <doctest/doctest.h>

#include <cgx/comm/hierarchical.hpp>
#include <cgx/comm/ring.hpp>
#include <cgx/comm/scatter_reduce_allgather.hpp>
#include <cgx/comm/tree.hpp>
#include <cgx/comm/uncompressed.hpp>
#include <cgx/layerwise.hpp>
#include <cgx/schedule/direct_reduce_scatter.hpp>
#include <cgx/schedule/hierarchical.hpp>
#include <cgx/schedule/ring.hpp>
#include <cgx/schedule/sra.hpp>
#include <cgx/schedule/tree.hpp>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <span>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

namespace sc = cgx::schedule;
using sc::chunk;

// Compressed sizes shaped like the real codecs': maxmin's (8 bytes of scale per started
// bucket of 512, then 4-bit codes) and raw floats.
constexpr std::size_t maxmin_like(std::size_t c) { return c == 0 ? 0 : 8 * ((c + 511) / 512) + (c + 1) / 2; }
constexpr std::size_t raw_floats(std::size_t c) { return 4 * c; }

struct codec {
  std::size_t granule;
  sc::size_fn bytes;
  bool lossless;
};
const codec codecs[] = {{512, &maxmin_like, false}, {1, &raw_floats, true}};

// Counts for p ranks and granule g: empty, tiny, around p and p granules, primes, and
// large enough for the pipelined SRA's and the crossed exchange's pieces.
std::vector<std::size_t> counts(int p, std::size_t g) {
  const auto P = static_cast<std::size_t>(p);
  std::vector<std::size_t> v{0, 1, P - 1, P, P + 1, 13, 1021, P * g - 1, P * g + 1, 3 * P * g + 7, 1000003,
                             P * (std::size_t{3} << 18) + 5, P * (std::size_t{9} << 20) + 4099};
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// Whether the ranges tile [0, n) exactly: every value once.
bool tiles(std::vector<chunk> cs, std::size_t n) {
  std::sort(cs.begin(), cs.end(), [](const chunk& a, const chunk& b) { return a.begin < b.begin; });
  std::size_t at = 0;
  for (const chunk& c : cs) {
    if (c.count == 0 || c.begin != at) return false;
    at += c.count;
  }
  return at == n;
}

// Whether no two ranges overlap.
bool disjoint(std::vector<chunk> cs) {
  std::sort(cs.begin(), cs.end(), [](const chunk& a, const chunk& b) { return a.begin < b.begin; });
  for (std::size_t i = 1; i < cs.size(); ++i)
    if (cs[i - 1].begin + cs[i - 1].count > cs[i].begin) return false;
  return true;
}

using msg_list = std::function<void(int, const std::function<void(const sc::message&)>&)>;
using comp_list = std::function<void(int, const std::function<void(const sc::compression&)>&)>;
using range_list = std::function<void(int, const std::function<void(const chunk&)>&)>;

// What one description says for all p ranks.
struct world {
  int p;
  std::size_t n;
  std::size_t workspace;  // bytes
  std::vector<std::vector<sc::message>> msgs;
  std::vector<std::vector<sc::compression>> comps;
  std::vector<std::vector<chunk>> results;

  world(int p_, std::size_t n_, std::size_t ws, const msg_list& m, const comp_list& c, const range_list& r)
      : p(p_), n(n_), workspace(ws), msgs(p_), comps(p_), results(p_) {
    for (int i = 0; i < p; ++i) {
      m(i, [&](const sc::message& x) { msgs[i].push_back(x); });
      c(i, [&](const sc::compression& x) { comps[i].push_back(x); });
      r(i, [&](const chunk& x) { results[i].push_back(x); });
    }
  }
};

std::string where(const world& w) { return "p=" + std::to_string(w.p) + " n=" + std::to_string(w.n); }

// The checks every description passes.
void check_common(const world& w) {
  INFO(where(w));
  for (int r = 0; r < w.p; ++r) {
    CHECK_MESSAGE(tiles(w.results[r], w.n), "rank " << r << " does not end with every value exactly once");
    for (const sc::message& m : w.msgs[r]) {
      const bool peers = (m.from == r || m.to == r) && m.from != m.to && m.from >= 0 && m.from < w.p && m.to >= 0 && m.to < w.p;
      const bool values = m.values.count != 0 && m.values.begin + m.values.count <= w.n;
      const bool fits = m.offset == sc::in_buffer || m.offset + m.bytes <= w.workspace;
      if (!(peers && values && fits)) CHECK_MESSAGE(false, "rank " << r << ": message " << m.from << " -> " << m.to << " of values "
                                                                 << m.values.begin << "+" << m.values.count << " at " << m.offset);
    }
    for (const sc::compression& c : w.comps[r])
      if (c.k.position != c.values.begin || c.offset > w.workspace)
        CHECK_MESSAGE(false, "rank " << r << ": compression of " << c.values.begin << " at position " << c.k.position);
  }
  // Per ordered pair and phase: the sends of one equal the receives of the other, in order.
  using sig = std::tuple<int, std::size_t, std::size_t, std::size_t>;  // step, begin, count, bytes
  std::map<std::tuple<int, int, int>, std::vector<sig>> sent, received;
  for (int r = 0; r < w.p; ++r)
    for (const sc::message& m : w.msgs[r])
      (m.from == r ? sent : received)[{m.from, m.to, static_cast<int>(m.ph)}].push_back(
          {m.step, m.values.begin, m.values.count, m.bytes});
  CHECK(sent == received);
  // No two compressions of overlapping values share a stream (their random bits would be
  // the same), on any ranks.
  std::map<std::uint32_t, std::vector<chunk>> by_stream;
  for (int r = 0; r < w.p; ++r)
    for (const sc::compression& c : w.comps[r]) by_stream[c.k.stream].push_back(c.values);
  for (const auto& e : by_stream) CHECK_MESSAGE(disjoint(e.second), "stream " << e.first << " reused");
}

// Finished sums are compressed exactly once, over all ranks.
void check_sums_once(const world& w) {
  INFO(where(w));
  std::vector<chunk> sums;
  for (int r = 0; r < w.p; ++r)
    for (const sc::compression& c : w.comps[r])
      if (c.ph == sc::phase::sum) sums.push_back(c.values);
  CHECK(tiles(sums, w.p > 1 ? w.n : 0));
}

// A compressed message is sent from where this rank compressed those values, or where it
// received them earlier (forwarding); the bytes match the codec's size.
void check_sources(const world& w, sc::size_fn bytes) {
  INFO(where(w));
  for (int r = 0; r < w.p; ++r) {
    std::vector<std::pair<std::size_t, std::size_t>> held;  // (offset, begin) written so far
    for (const sc::compression& c : w.comps[r]) held.emplace_back(c.offset, c.values.begin);
    for (const sc::message& m : w.msgs[r]) {
      if (m.bytes != bytes(m.values.count)) CHECK_MESSAGE(false, "rank " << r << ": message of " << m.values.count << " values, " << m.bytes << " bytes");
      if (m.to == r) {
        held.emplace_back(m.offset, m.values.begin);
      } else {
        const bool found = std::find(held.begin(), held.end(), std::pair{m.offset, m.values.begin}) != held.end();
        if (!found) CHECK_MESSAGE(false, "rank " << r << " sends values " << m.values.begin << " from " << m.offset << " before writing them");
      }
    }
  }
}

template <class F>
void for_each_case(F&& f) {
  for (const codec& q : codecs)
    for (int p = 1; p <= 8; ++p)
      for (std::size_t n : counts(p, q.granule)) f(q, p, n);
}

}  // namespace

TEST_CASE("schedule::sra: coverage, matching messages, keys, workspace, both forms") {
  for_each_case([](const codec& q, int p, std::size_t n) {
    const auto pipe = sc::sra::pipelined(n, p, q.granule, 4, q.bytes);
    const auto two = sc::sra::two_phase(n, p, q.granule, 4, q.bytes);
    const auto whole = sc::sra::whole(n, p, q.granule, q.bytes);
    // Slots sized for a larger count (comm::device_sra's workspace for max_n = 2 n + 1).
    const auto whole_in = sc::sra::whole_in(n, p, q.granule, q.bytes, sc::sra::whole(2 * n + 1, p, q.granule, q.bytes).slot);
    CHECK(whole_in.slot >= whole.slot);
    for (const sc::sra& d : {pipe, two, whole, whole_in}) {
      // Every message and compression lies in the slots the form says it uses.
      CHECK(d.slots_used() == (d.gather_base == 2 ? sc::sra::slots(p) : 2 * static_cast<std::size_t>(p)));
      const world w(p, n, d.slots_used() * d.slot, [&](int r, auto f) { d.messages(r, f); },
                    [&](int r, auto f) { d.compressions(r, f); }, [&](int r, auto f) { d.results(r, f); });
      check_common(w);
      check_sums_once(w);
      check_sources(w, q.bytes);
      // The pipelined form posts every receive at once: they must not share workspace
      // bytes, nor with what is compressed. The two-phase form reuses the receive slots
      // for the allgather, after the scatter is done: disjoint within each phase.
      for (int r = 0; r < p; ++r)
        for (int half = 0; half < 2; ++half) {
          const bool pipelined = d.gather_base == 2;
          auto in_half = [&](int step) { return pipelined || step == half; };
          std::vector<chunk> regions;
          for (const sc::message& m : w.msgs[r])
            if (m.to == r && in_half(m.step)) regions.push_back({m.offset, m.bytes});
          for (const sc::compression& c : w.comps[r])
            if (in_half(c.step)) regions.push_back({c.offset, q.bytes(c.values.count)});
          CHECK(disjoint(regions));
        }
      // The owner adds the others' parts in rank order.
      for (int o = 0; o < p; ++o)
        for (int i = 0; i + 1 < p; ++i) CHECK(sc::sra::addend(o, i) == (i < o ? i : i + 1));
    }
    // The pipelined and the two-phase form draw the same random bits for every value:
    // per stream, the same values (positions are the values' indices in both).
    auto merged = [&](const sc::sra& d) {
      std::map<std::uint32_t, std::vector<chunk>> m;
      for (int r = 0; r < p; ++r) d.compressions(r, [&](const sc::compression& c) { m[c.k.stream].push_back(c.values); });
      std::map<std::uint32_t, std::pair<std::size_t, std::size_t>> span;  // stream -> (first, values)
      for (auto& [s, cs] : m) {
        std::size_t first = n, total = 0;
        for (const chunk& c : cs) first = std::min(first, c.begin), total += c.count;
        span[s] = {first, total};
      }
      return span;
    };
    INFO("p=" << p << " n=" << n);
    CHECK(merged(pipe) == merged(two));
    CHECK(merged(whole) == merged(two));
    CHECK(merged(whole_in) == merged(two));
    CHECK(pipe.slot == two.slot);
    // The whole form's slot holds the largest whole chunk, and no more.
    CHECK(whole.K == 1);
    CHECK(whole.slot == cgx::comm::round_to_line(q.bytes(cgx::comm::largest_chunk(n, p, q.granule))));
    CHECK(whole.slot <= two.slot);
    if (p > 1 && n * 4 / static_cast<std::size_t>(p) >= (std::size_t{16} << 20)) CHECK(pipe.K == sc::sra::max_pieces);
  });
}

TEST_CASE("schedule::sra_pattern: peers pair up, slots apart, keys apart; over a layer-wise cut") {
  for (int p = 1; p <= 8; ++p)
    for (int gather_base : {1, 2}) {
      const sc::sra_pattern d{p, gather_base, 192};
      INFO("p=" << p << " gather_base=" << gather_base);
      for (int r = 0; r < p; ++r) {
        std::vector<int> tos, froms, adds, others;
        for (int q = 0; q < p; ++q)
          if (q != r) others.push_back(q);
        for (int s = 1; s < p; ++s) {
          tos.push_back(d.to(r, s));
          froms.push_back(d.from(r, s));
          CHECK(d.from(d.to(r, s), s) == r);  // whom r sends to at step s takes r's at step s
        }
        for (int i = 0; i + 1 < p; ++i) adds.push_back(d.addend(r, i));
        CHECK(adds == others);  // the others, in rank order
        std::sort(tos.begin(), tos.end());
        std::sort(froms.begin(), froms.end());
        CHECK(tos == others);
        CHECK(froms == others);
      }
      // Send and receive slots apart; gather slots apart from the send slots (the
      // receive slots again when gather_base is 1); all within slots_used().
      std::vector<chunk> scatter, gather;
      for (int r = 0; r < p; ++r) {
        scatter.push_back({d.send_slot(r), d.slot});
        scatter.push_back({d.recv_slot(r), d.slot});
        gather.push_back({d.send_slot(r), d.slot});
        gather.push_back({d.gather_slot(r), d.slot});
        CHECK(d.gather_slot(r) + d.slot <= d.slots_used() * d.slot);
        if (gather_base == 1) CHECK(d.gather_slot(r) == d.recv_slot(r));
      }
      CHECK(disjoint(scatter));
      CHECK(disjoint(gather));
    }
  // layerwise_plan's keys over layerwise.hpp's cut (layers with gaps, mixed settings):
  // per stream the compressed pieces are disjoint, positions are the pieces' first
  // values, every layer value is summed once, and every chunk fits a slot.
  const std::vector<cgx::layer> layers{{0, 3000}, {3000, 10}, {3100, 70001}, {80000, 0}, {80000, 5000}, {90000, 1}};
  const std::vector<cgx::layer_setting> settings{{4, 1024}, {0, 1024}, {2, 128}, {8, 512}, {1, 512}, {3, 1024}};
  for (int p = 1; p <= 8; ++p) {
    INFO("p=" << p);
    cgx::layerwise_layout cut(100000, layers);
    cut.cut(settings, p, &cgx::setting_bytes<float>);
    const sc::sra_pattern d{p, 1, cut.slot_bytes()};
    std::map<std::uint32_t, std::vector<chunk>> by_stream;
    std::vector<chunk> sums;
    for (int o = 0; o < p; ++o) {
      CHECK(cut.chunk_bytes(o) <= d.slot);
      for (const auto& pc : cut.pieces(o)) {
        const chunk v{pc.begin, pc.count};
        for (int r = 0; r < p; ++r) {
          const sc::key k = r == o ? d.sum_key(o, v) : sc::sra_pattern::contribution_key(r, v);
          CHECK(k.position == pc.begin);
          by_stream[k.stream].push_back(v);
          if (r == o) sums.push_back(v);
        }
      }
    }
    for (const auto& e : by_stream) CHECK_MESSAGE(disjoint(e.second), "stream " << e.first << " reused");
    std::size_t summed = 0;
    for (const chunk& c : sums) summed += c.count;
    CHECK(summed == 3000 + 10 + 70001 + 5000 + 1);
    CHECK(disjoint(sums));
  }
}

TEST_CASE("schedule::ring: coverage, matching messages, keys, forwarding") {
  for_each_case([](const codec& q, int p, std::size_t n) {
    const auto d = sc::ring::make(n, p, q.granule, q.bytes);
    const world w(p, n, sc::ring::slots(p) * d.slot, [&](int r, auto f) { d.messages(r, f); },
                  [&](int r, auto f) { d.compressions(r, f); }, [&](int r, auto f) { d.results(r, f); });
    check_common(w);
    check_sums_once(w);
    check_sources(w, q.bytes);
    // Chunk c's sum starts at rank c and goes round; rank r finishes chunk r + 1.
    for (int c = 0; c < p; ++c) {
      std::vector<int> seen;
      for (int i = 0; i < p; ++i) seen.push_back(d.addend(c, i));
      std::sort(seen.begin(), seen.end());
      for (int i = 0; i < p; ++i) CHECK(seen[static_cast<std::size_t>(i)] == i);
      CHECK(d.addend(c, p - 1) == (c + p - 1) % p);
      CHECK(d.owned(d.addend(c, p - 1)) == c);
    }
  });
}

TEST_CASE("schedule::tree: coverage, matching messages, keys, fold and unfold") {
  for_each_case([](const codec& q, int p, std::size_t n) {
    const auto d = sc::tree::make(n, p, q.granule, q.bytes);
    const world w(p, n, static_cast<std::size_t>(d.q) * d.slot + 2 * d.whole, [&](int r, auto f) { d.messages(r, f); },
                  [&](int r, auto f) { d.compressions(r, f); }, [&](int r, auto f) { d.results(r, f); });
    check_common(w);
    check_sums_once(w);
    check_sources(w, q.bytes);
    // Virtual ranks: a bijection of the active ranks onto 0..q-1.
    std::vector<int> seen;
    for (int r = 0; r < p; ++r)
      if (d.virtual_rank(r) >= 0) {
        CHECK(d.real(d.virtual_rank(r)) == r);
        seen.push_back(d.virtual_rank(r));
      }
    CHECK(static_cast<int>(seen.size()) == d.q);
    // After halving, virtual rank v keeps exactly chunk v.
    for (int v = 0; v < d.q; ++v) {
      int lo = 0, hi = d.q;
      for (int i = 1; i <= d.levels(); ++i) {
        const auto h = d.halve(v, i);
        CHECK((h.klo >= lo && h.khi <= hi && h.slo >= lo && h.shi <= hi));
        CHECK(h.khi - h.klo == h.shi - h.slo);
        lo = h.klo, hi = h.khi;
      }
      CHECK((lo == v && hi == v + 1));
    }
  });
}

TEST_CASE("schedule::direct_reduce_scatter: coverage and matching messages, no compression") {
  for_each_case([](const codec& q, int p, std::size_t n) {
    const auto d = sc::direct_reduce_scatter::make(n, p, q.granule, 4);
    const world w(p, n, sc::direct_reduce_scatter::slots(p) * d.slot, [&](int r, auto f) { d.messages(r, f); },
                  [&](int r, auto f) { d.compressions(r, f); }, [&](int r, auto f) { d.results(r, f); });
    check_common(w);
    for (int r = 0; r < p; ++r) {
      CHECK(w.comps[r].empty());
      std::vector<chunk> parts;  // the part slots receive at once: disjoint
      for (const sc::message& m : w.msgs[r]) {
        if (m.bytes != 4 * m.values.count) CHECK_MESSAGE(false, "raw message of " << m.values.count << " values, " << m.bytes << " bytes");
        if (m.ph == sc::phase::scatter && m.to == r) parts.push_back({m.offset, m.bytes});
      }
      CHECK(disjoint(parts));
    }
  });
}

TEST_CASE("schedule::hierarchical: groups, crossed exchange, fused node sum, share") {
  const std::pair<int, int> layouts[] = {{1, 1}, {1, 3}, {2, 1}, {2, 2}, {2, 3}, {3, 2}, {2, 4}, {4, 2}, {3, 3}};
  for (const codec& q : codecs)
    for (const auto& layout : layouts)
      for (std::size_t n : counts(layout.first * layout.second, q.granule))
        for (int flags = 0; flags < 4; ++flags) {
          const int N = layout.first, L = layout.second;
          const sc::hierarchical d{n, N, L, q.granule, 4, q.bytes, q.lossless, (flags & 1) != 0, (flags & 2) != 0};
          const int p = N * L;
          auto node_of = [&](int r) { return r / L; };
          auto local_of = [&](int r) { return r % L; };
          std::size_t ws = d.fused_parts_offset() + static_cast<std::size_t>(L) * d.raw_slot();
          ws = std::max(ws, static_cast<std::size_t>(L + 2) * d.share_slot());
          const world w(p, n, ws, [&](int r, auto f) { d.messages(node_of(r), local_of(r), f); },
                        [&](int r, auto f) { d.compressions(node_of(r), local_of(r), f); },
                        [&](int r, auto f) { d.results(node_of(r), local_of(r), f); });
          INFO("N=" << N << " L=" << L << " flags=" << flags);
          check_common(w);
          std::vector<chunk> cut;
          for (int l = 0; l < L; ++l)
            if (d.chunk_of(l).count != 0) cut.push_back(d.chunk_of(l));
          CHECK(tiles(cut, n));
          CHECK((d.crossed_groups() == 0 || (N == 2 && d.crossed_groups() == L - L % 2)));
          // A crossed group: its pieces tile its chunk, the owner node compresses every sum once.
          for (int l = 0; l < d.crossed_groups(); ++l) {
            const chunk c = d.chunk_of(l);
            std::vector<chunk> pieces, sums;
            for (std::size_t k = 0; k < d.cross_pieces(c.count); ++k) {
              const chunk pv = d.piece_values(c.count, k);
              pieces.push_back({pv.begin, pv.count});
            }
            if (c.count != 0) CHECK(tiles(pieces, c.count));
            for (const sc::compression& x : w.comps[d.rank(sc::hierarchical::owner(l), l)]) {
              CHECK(x.ph == sc::phase::sum);
              sums.push_back(x.values);
            }
            for (chunk& s : sums) s.begin -= c.begin;
            CHECK(tiles(sums, c.count));
          }
        }
}

TEST_CASE("schedule descriptions are constexpr") {
  constexpr auto s = sc::sra::pipelined(1000, 3, 1, 4, &raw_floats);
  static_assert(s.chunk_of(2).begin + s.chunk_of(2).count == 1000);
  static_assert(s.sum_key(1, s.chunk_of(1)).stream == 4);
  constexpr auto t = sc::tree::make(1000, 6, 1, &raw_floats);
  static_assert(t.q == 4 && t.virtual_rank(0) == -1 && t.virtual_rank(5) == 3);
  constexpr auto g = sc::ring::make(1000, 5, 1, &raw_floats);
  static_assert(g.owned(4) == 0 && g.reduce_in(0, 0) == 4);
  CHECK(s.K == 1);
}

// ---- The executors post what the descriptions say ---------------------------------
//
// Each rank's executor runs alone over a transport that records every message and lets
// it complete at once without moving bytes, with a codec that records every compression
// and computes nothing (the values are garbage; the schedule is what is compared).

namespace {

struct event {
  bool send;
  int peer;
  std::size_t bytes, offset;  // offset: in the workspace, or in_buffer
  friend bool operator==(const event&, const event&) = default;
};
struct packed {
  std::size_t begin, count;  // values compressed (index in buf)
  std::uint32_t stream;
  std::size_t position, offset;
  friend bool operator==(const packed&, const packed&) = default;
};

struct recorder {
  const std::byte* ws = nullptr;
  std::size_t ws_bytes = 0;
  const float* buf = nullptr;
  std::vector<event> events;
  std::vector<int> tags;  // of each event
  std::vector<packed> packs;
  std::vector<std::uint64_t> seeds;  // of each pack
  std::size_t where(const void* ptr) const {
    const auto* b = static_cast<const std::byte*>(ptr);
    return b >= ws && b < ws + ws_bytes ? static_cast<std::size_t>(b - ws) : sc::in_buffer;
  }
};
recorder* rec = nullptr;

// Rank r of p; peers are recorded as global ranks base + peer * stride. As a world of
// N nodes of L ranks (node-major), node() and split() give the node's and the group's.
struct recording_transport {
  struct request {};
  int r, p;
  int base = 0, stride = 1;
  int N = 1, L = 1;
  int rank() const { return r; }
  int size() const { return p; }
  request isend(const void* ptr, std::size_t bytes, int peer, int tag) {
    rec->events.push_back({true, base + peer * stride, bytes, rec->where(ptr)});
    rec->tags.push_back(tag);
    return {};
  }
  request irecv(void* ptr, std::size_t bytes, int peer, int tag) {
    rec->events.push_back({false, base + peer * stride, bytes, rec->where(ptr)});
    rec->tags.push_back(tag);
    return {};
  }
  void wait_all(std::span<request>) {}
  void max_all(std::span<std::int64_t>) {}
  recording_transport node() const { return {r % L, L, r / L * L, 1, 1, L}; }
  recording_transport split(int local, int) const { return {r / L, N, local, L, N, 1}; }
};

template <std::size_t Bucket, sc::size_fn Bytes>
struct recording_codec {
  static constexpr std::size_t bucket_size = Bucket;
  static constexpr bool lossless = Bucket == 0;
  template <class T>
  static constexpr std::size_t compressed_bytes(std::size_t n) noexcept {
    return Bytes(n);
  }
  template <class T>
  static void compress(const T* in, std::size_t n, std::byte* out, const cgx::quant::rng_state& s = {}, cgx::quant::host_exec = {}) {
    rec->packs.push_back({static_cast<std::size_t>(in - rec->buf), n, s.stream, static_cast<std::size_t>(s.position), rec->where(out)});
    rec->seeds.push_back(s.seed);
  }
  template <class T>
  static void decompress(const std::byte*, std::size_t, T*, cgx::quant::host_exec = {}) {}
  template <class T>
  static void decompress_add(const std::byte*, std::size_t, T*, cgx::quant::host_exec = {}) {}
};
constexpr std::size_t raw_bytes(std::size_t c) { return 4 * c; }
using codec_512 = recording_codec<512, &maxmin_like>;
using codec_raw = recording_codec<0, &raw_bytes>;

// Runs the executor of R for rank r of p on n values and returns what it posted.
template <class R, class Q, class Run>
recorder record(int r, int p, std::size_t n, Run&& run, int N = 1, int L = 1) {
  using S = typename R::template schedule<float, Q, recording_transport>;
  recorder out;
  rec = &out;  // the constructor may post nothing, but a hierarchical one splits
  // Never read: the codec computes nothing (so no zeroing of large buffers either).
  const std::size_t ws_bytes = S::workspace_bytes(n, p) + 1;
  const std::unique_ptr<std::byte[]> ws(new std::byte[ws_bytes]);
  const std::unique_ptr<float[]> buf(new float[n + 1]);
  out.ws = ws.get();
  out.ws_bytes = ws_bytes;
  out.buf = buf.get();
  rec = &out;
  recording_transport x{r, p, 0, 1, N, L};
  S sched(x);
  run(sched, buf.get(), x, ws.get());
  rec = nullptr;
  return out;
}

// What a description says rank r posts and compresses, in the same form.
template <class D>
recorder expected(const D& d, int r) {
  recorder out;
  d.messages(r, [&](const sc::message& m) {
    out.events.push_back({m.from == r, m.from == r ? m.to : m.from, m.bytes, m.offset});
  });
  d.compressions(r, [&](const sc::compression& c) {
    out.packs.push_back({c.values.begin, c.values.count, c.k.stream, c.k.position, c.offset});
  });
  return out;
}

// Compressions compared as sets: the description lists them by piece, not in time.
bool same_packs(std::vector<packed> a, std::vector<packed> b) {
  auto less = [](const packed& x, const packed& y) {
    return std::tie(x.stream, x.begin, x.count, x.offset) < std::tie(y.stream, y.begin, y.count, y.offset);
  };
  std::sort(a.begin(), a.end(), less);
  std::sort(b.begin(), b.end(), less);
  return a == b;
}

template <class Q, class F>
void for_each_executor_case(F&& f) {
  for (int p = 1; p <= 8; ++p)
    for (std::size_t n : counts(p, Q::bucket_size == 0 ? 1 : Q::bucket_size))
      if (n < (std::size_t{1} << 21)) f(p, n);  // pipelined SRA (K = 3) at p = 2
}

template <class Q>
void check_executors() {
  constexpr std::size_t g = Q::bucket_size == 0 ? 1 : Q::bucket_size;
  const sc::size_fn bytes = &Q::template compressed_bytes<float>;
  const cgx::quant::rng_state rng{};
  for_each_executor_case<Q>([&](int p, std::size_t n) {
    for (int r = 0; r < p; ++r) {
      INFO("p=" << p << " n=" << n << " r=" << r);
      {
        const auto got = record<cgx::comm::scatter_reduce_allgather, Q>(
            r, p, n, [&](auto& s, float* b, auto& x, std::byte* ws) { s.run(b, n, x, ws, rng, {}); });
        const auto want = expected(sc::sra::pipelined(n, p, g, 4, bytes), r);
        CHECK_MESSAGE(got.events == want.events, "sra run");
        CHECK_MESSAGE(same_packs(got.packs, want.packs), "sra run");
      }
      {
        const auto got = record<cgx::comm::scatter_reduce_allgather, Q>(r, p, n, [&](auto& s, float* b, auto& x, std::byte* ws) {
          s.scatter_reduce(b, n, x, ws, rng, {});
          s.allgather(b, n, x, ws, {});
        });
        const auto d = sc::sra::two_phase(n, p, g, 4, bytes);
        recorder want = expected(d, r);
        // The two-phase form posts the allgather's receives after the scatter: compare
        // per phase (the events of one phase keep their order).
        std::vector<event> scatter, gather;
        d.messages(r, [&](const sc::message& m) {
          (m.ph == sc::phase::scatter ? scatter : gather).push_back({m.from == r, m.from == r ? m.to : m.from, m.bytes, m.offset});
        });
        scatter.insert(scatter.end(), gather.begin(), gather.end());
        CHECK_MESSAGE(got.events == scatter, "sra scatter_reduce + allgather");
        CHECK_MESSAGE(same_packs(got.packs, want.packs), "sra scatter_reduce + allgather");
      }
      {
        const auto got = record<cgx::comm::ring, Q>(r, p, n, [&](auto& s, float* b, auto& x, std::byte* ws) { s.run(b, n, x, ws, rng, {}); });
        const auto want = expected(sc::ring::make(n, p, g, bytes), r);
        CHECK_MESSAGE(got.events == want.events, "ring");
        CHECK_MESSAGE(same_packs(got.packs, want.packs), "ring");
      }
      {
        const auto got = record<cgx::comm::tree, Q>(r, p, n, [&](auto& s, float* b, auto& x, std::byte* ws) { s.run(b, n, x, ws, rng, {}); });
        const auto want = expected(sc::tree::make(n, p, g, bytes), r);
        CHECK_MESSAGE(got.events == want.events, "tree");
        CHECK_MESSAGE(same_packs(got.packs, want.packs), "tree");
      }
      if (n < (std::size_t{1} << 20)) {  // it sums raw values for real: keep it small
        const auto got =
            record<cgx::comm::uncompressed, Q>(r, p, n, [&](auto& s, float* b, auto& x, std::byte* ws) { s.run(b, n, x, ws, rng, {}); });
        const auto want = expected(sc::direct_reduce_scatter::make(n, p, g, 4), r);
        CHECK_MESSAGE(got.events == want.events, "uncompressed");
        CHECK(got.packs.empty());
      }
    }
  });
}

}  // namespace

TEST_CASE("the executors post and compress what the descriptions say (sra, ring, tree, uncompressed)") {
  check_executors<codec_512>();
  check_executors<codec_raw>();
}

TEST_CASE("the hierarchical executor posts and compresses what its description says (node, cross, back, share)") {
  const std::pair<int, int> layouts[] = {{1, 2}, {2, 1}, {2, 2}, {2, 3}, {3, 2}, {2, 4}};
  const cgx::quant::rng_state rng{};
  constexpr std::size_t g = codec_512::bucket_size;
  auto run = [&]<class Intra, class Inter>(int N, int L, std::size_t n) {
    using H = cgx::comm::hierarchical<Intra, Inter>;
    constexpr bool raw_wire = Inter::quantizations(2) == 0;
    const sc::hierarchical d{n, N, L, g, 4, raw_wire ? &raw_bytes : &maxmin_like, raw_wire, true,
                             std::is_same_v<Intra, cgx::comm::uncompressed>};
    for (int r = 0; r < N * L; ++r) {
      INFO("N=" << N << " L=" << L << " n=" << n << " r=" << r << " intra=" << std::string(Intra::name) << " inter=" << std::string(Inter::name));
      const int node = r / L, l = r % L;
      const recorder got = record<H, codec_512>(
          r, N * L, n, [&](auto& s, float* b, auto& x, std::byte* ws) { s.run(b, n, x, ws, rng, {}); }, N, L);
      std::vector<event> own;  // hierarchical's own tags: share, cross, back, node
      for (std::size_t i = 0; i < got.events.size(); ++i)
        if (got.tags[i] >= 0x6380 && got.tags[i] <= 0x6383) own.push_back(got.events[i]);
      recorder want;
      d.messages(node, l, [&](const sc::message& m) {
        want.events.push_back({m.from == r, m.from == r ? m.to : m.from, m.bytes, m.offset});
      });
      d.compressions(node, l, [&](const sc::compression& c) {
        want.packs.push_back({c.values.begin, c.values.count, c.k.stream, c.k.position, c.offset});
      });
      CHECK(own == want.events);
      // Crossed, every compression on the inter seed is the crossed exchange's (a raw
      // wire goes through quant::none, which this codec does not see).
      if (d.crossed(l) && !raw_wire) {
        std::vector<packed> cross;
        for (std::size_t i = 0; i < got.packs.size(); ++i)
          if (got.seeds[i] == (rng.seed ^ sc::hierarchical::inter_seed)) cross.push_back(got.packs[i]);
        CHECK(same_packs(cross, want.packs));
      }
    }
  };
  for (auto [N, L] : layouts) {
    const auto Ls = static_cast<std::size_t>(L);
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{13}, Ls * g + 1, Ls * (std::size_t{1} << 19),
                          Ls * (std::size_t{1} << 19) + 4099}) {  // crossed, 2 pieces
      // Large counts cross groups only on two nodes; elsewhere they repeat the small
      // ones, at the price of real raw sums over millions of values (sanitizer builds).
      if (n >= (std::size_t{1} << 19) && (N != 2 || L > 3)) continue;
      run.template operator()<cgx::comm::uncompressed, cgx::comm::ring>(N, L, n);
      run.template operator()<cgx::comm::uncompressed, cgx::comm::uncompressed>(N, L, n);
      run.template operator()<cgx::comm::scatter_reduce_allgather, cgx::comm::ring>(N, L, n);
    }
  }
}
