// libFuzzer harness: the variable-size exchange (comm/varsize.hpp: length headers, then
// payloads) and the error-bounded SRA and ring schedules that decode what it receives,
// run on one rank whose peers' messages are the fuzzer's bytes.
//
// Input: byte 0 = mode (bit 0: ring, else SRA; bit 3: double, else float; (mode >> 1) % 3
// + 2 = ranks p), byte 1 = this rank (% p), bytes 2-3 = n (little-endian, % 1024), byte 4 = bound
// exponent, then the bytes every receive of the schedule takes, in the order the schedule
// posts them (an 8-byte length header per message, then its payload of that length).
// The transport below hands out the next bytes at each receive and drops every send;
// when the input runs out the run ends (a real peer would keep the rank waiting).
// A run must finish or throw cgx::error(errc::corrupt), never touch memory outside the
// workspace and the buffer (ASan), never hit undefined behaviour (UBSan).
#include <cgx/comm/error_bounded_schedules.hpp>
#include <cgx/error.hpp>
#include <cgx/quant/error_bounded.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "fuzz_input.hpp"

namespace {

struct starved {};  // the input ran out: the run stops here

// A transport of p ranks seen from rank `me`: receives read the fuzzer's bytes.
struct fuzz_transport {
  struct request {};
  int me = 0, p = 2;
  cgx_fuzz::input* in = nullptr;
  int rank() const { return me; }
  int size() const { return p; }
  request isend(const void*, std::size_t, int, int) { return {}; }
  request irecv(void* buf, std::size_t bytes, int, int) {
    if (in->left < bytes) throw starved{};
    std::memcpy(buf, in->p, bytes);
    in->p += bytes;
    in->left -= bytes;
    return {};
  }
  void wait_all(std::span<request>) {}
  void max_all(std::span<std::int64_t>) {}
};

template <class R, class T>
void run(cgx_fuzz::input& in, int p, int me, std::size_t n, int exponent) {
  using Q = cgx::quant::error_bounded<64>;  // small buckets: many per message
  using S = typename cgx::comm::error_bounded_schedule<R>::template schedule<T, Q, fuzz_transport>;
  fuzz_transport x{me, p, &in};
  std::vector<T> buf(n);
  for (std::size_t i = 0; i < n; ++i) buf[i] = static_cast<T>(cgx_fuzz::value_of(me, i));
  const std::size_t ws_bytes = S::workspace_bytes(n, p);
  std::vector<std::byte> ws(ws_bytes);  // exactly the documented size: ASan sees a write past it
  S s(x);
  try {
    s.run(buf.data(), n, x, ws.data(), std::ldexp(1.0, -exponent));
  } catch (const starved&) {
  } catch (const cgx::error& e) {
    if (e.code() != cgx::errc::corrupt) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  cgx_fuzz::input in{data, size};
  const unsigned mode = in.byte();
  const int p = static_cast<int>((mode >> 1) % 3) + 2;
  const int me = in.byte() % p;
  const std::size_t n = in.u16() % 1024;  // up to 16 buckets of 64: the schedule, not the codec, is fuzzed here
  const int exponent = in.byte() % 48;
  const bool use_ring = (mode & 1) != 0, dbl = (mode & 8) != 0;
  using sra = cgx::comm::scatter_reduce_allgather;
  using ring = cgx::comm::ring;
  if (use_ring)
    dbl ? run<ring, double>(in, p, me, n, exponent) : run<ring, float>(in, p, me, n, exponent);
  else
    dbl ? run<sra, double>(in, p, me, n, exponent) : run<sra, float>(in, p, me, n, exponent);
  return 0;
}
