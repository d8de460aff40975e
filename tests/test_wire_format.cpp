// The maxmin wire format: exact sizes, the byte layout of the codes, the metadata.
#include <doctest/doctest.h>

#include <cgx/quant/maxmin.hpp>

#include <cstring>
#include <vector>

namespace {

using cgx::quant::maxmin;
using cgx::quant::nearest;

// Size from the specification, counted bucket by bucket (not with the library's formula).
std::size_t spec_bytes(int bits, std::size_t B, std::size_t meta, std::size_t n) {
  std::size_t total = 0;
  for (std::size_t first = 0; first < n; first += B) {
    const std::size_t count = n - first < B ? n - first : B;
    const std::size_t padded = (count + 7) / 8 * 8;
    total += 2 * meta + static_cast<std::size_t>(bits) * padded / 8;
  }
  return total;
}

template <int Bits, std::size_t B>
void sizes_for() {
  using Q = maxmin<Bits, B, nearest>;
  for (std::size_t nb = 0; nb <= 3; ++nb) {
    for (long d : {-9L, -8L, -7L, -1L, 0L, 1L, 7L, 8L, 9L}) {
      const long n = static_cast<long>(nb * B) + d;
      if (n < 0) continue;
      const auto un = static_cast<std::size_t>(n);
      CAPTURE(Bits);
      CAPTURE(B);
      CAPTURE(n);
      CHECK(Q::template compressed_bytes<float>(un) == spec_bytes(Bits, B, 4, un));
      CHECK(Q::template compressed_bytes<double>(un) == spec_bytes(Bits, B, 8, un));
    }
  }
}

template <int Bits>
void sizes_all_buckets() {
  sizes_for<Bits, 32>();
  sizes_for<Bits, 128>();
  sizes_for<Bits, 512>();
  sizes_for<Bits, 1024>();
  sizes_for<Bits, 4096>();
}

}  // namespace

TEST_CASE("compressed_bytes is exact for every width, bucket size and n across bucket boundaries") {
  sizes_all_buckets<1>();
  sizes_all_buckets<2>();
  sizes_all_buckets<3>();
  sizes_all_buckets<4>();
  sizes_all_buckets<5>();
  sizes_all_buckets<6>();
  sizes_all_buckets<7>();
  sizes_all_buckets<8>();
}

TEST_CASE("compressed_bytes: worked examples") {
  // One full 4-bit bucket of 1024 floats: 8 bytes of metadata + 1024 * 4 / 8 codes.
  CHECK(maxmin<4, 1024>::compressed_bytes<float>(1024) == 520);
  // One more value opens a bucket of 8 padded values: 8 + 4 bytes.
  CHECK(maxmin<4, 1024>::compressed_bytes<float>(1025) == 532);
  CHECK(maxmin<4, 1024>::compressed_bytes<double>(1025) == 548);
  CHECK(maxmin<3, 32>::compressed_bytes<float>(33) == 8 + 12 + 8 + 3);
  CHECK(maxmin<8, 4096>::compressed_bytes<float>(1) == 8 + 8);  // one value pads to 8 codes
  CHECK(maxmin<1, 128>::compressed_bytes<float>(0) == 0);
  // The ratio the demo quotes: 64 MiB of fp32 at 4 bits, bucket 1024.
  CHECK(maxmin<4, 1024>::compressed_bytes<float>(std::size_t{16} << 20) == (std::size_t{16} << 20) / 1024 * 520);
}

namespace {

// Values chosen so that code == value: the bucket spans [0, L], unit 1, nearest rounding.
template <int Bits>
void layout_for() {
  constexpr std::size_t B = 64;
  constexpr std::size_t S = B / 8;
  constexpr unsigned L = (1u << Bits) - 1;
  std::vector<float> x(B);
  std::vector<unsigned> code(B);
  for (std::size_t i = 0; i < B; ++i) {
    code[i] = static_cast<unsigned>((i * 37 + 11) % (L + 1));
  }
  code[5] = 0;
  code[9] = L;
  for (std::size_t i = 0; i < B; ++i) x[i] = static_cast<float>(code[i]);
  using Q = maxmin<Bits, B, nearest>;
  std::vector<std::byte> c(Q::template compressed_bytes<float>(B));
  Q::template compress<float>(x.data(), B, c.data());
  float meta[2];
  std::memcpy(meta, c.data(), sizeof(meta));
  CHECK(meta[0] == 0.0f);
  CHECK(meta[1] == 1.0f);
  const auto* planes = reinterpret_cast<const unsigned char*>(c.data()) + 8;
  // Bit t of word W_j is bit (t mod b) of the code of value j + (t div b) S; byte q of
  // W_j is stored at planes[q S + j].
  std::size_t wrong = 0;
  for (std::size_t j = 0; j < S; ++j) {
    for (int t = 0; t < 8 * Bits; ++t) {
      const std::size_t value = j + static_cast<std::size_t>(t / Bits) * S;
      const unsigned want = (code[value] >> (t % Bits)) & 1u;
      const unsigned got = (planes[static_cast<std::size_t>(t / 8) * S + j] >> (t % 8)) & 1u;
      wrong += want != got ? 1 : 0;
    }
  }
  CAPTURE(Bits);
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("code layout: strided slices, little-endian b-byte words stored as b planes") {
  layout_for<1>();
  layout_for<2>();
  layout_for<3>();
  layout_for<4>();
  layout_for<5>();
  layout_for<6>();
  layout_for<7>();
  layout_for<8>();
}

TEST_CASE("code layout: 8 bits is the plain code array, 4 bits pairs values j and j + B/2") {
  std::vector<float> x(32);
  for (std::size_t i = 0; i < 32; ++i) x[i] = static_cast<float>(i);
  std::vector<std::byte> c(maxmin<8, 32, nearest>::compressed_bytes<float>(32));
  // unit = 31/255: not exact; use values on the grid instead: i * unit.
  for (std::size_t i = 0; i < 32; ++i) x[i] = static_cast<float>(i * 8);  // codes 0..248 step 8 in [0,248]
  x[31] = 255.0f;
  maxmin<8, 32, nearest>::compress<float>(x.data(), 32, c.data());
  const auto* codes = reinterpret_cast<const unsigned char*>(c.data()) + 8;
  for (std::size_t i = 0; i < 31; ++i) CHECK(codes[i] == i * 8);
  CHECK(codes[31] == 255);

  std::vector<float> y(32);
  for (std::size_t i = 0; i < 32; ++i) y[i] = static_cast<float>(i % 16);
  std::vector<std::byte> c4(maxmin<4, 32, nearest>::compressed_bytes<float>(32));
  maxmin<4, 32, nearest>::compress<float>(y.data(), 32, c4.data());
  const auto* p = reinterpret_cast<const unsigned char*>(c4.data()) + 8;
  // S = 4; byte j of plane q holds values j + 2qS (low nibble) and j + (2q+1)S (high).
  for (std::size_t q = 0; q < 4; ++q)
    for (std::size_t j = 0; j < 4; ++j) {
      const unsigned lo = static_cast<unsigned>(y[j + 2 * q * 4]);
      const unsigned hi = static_cast<unsigned>(y[j + (2 * q + 1) * 4]);
      CHECK(p[q * 4 + j] == (lo | (hi << 4)));
    }
}

// ---- CRC-32C of the optional wire integrity check (plan_options::verify) ----------

#include <cgx/detail/crc32c.hpp>

#include <random>

namespace {
// Bit by bit from the definition (reflected 0x82F63B78, initial and final XOR ~0).
std::uint32_t crc32c_bitwise(const unsigned char* p, std::size_t n) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? 0x82F63B78u : 0u);
  }
  return ~c;
}
}  // namespace

TEST_CASE("crc32c: the published check value, every path equal to the definition at every length and alignment") {
  using cgx::detail::crc32c;
  using cgx::detail::crc32c_path;
  const char* check = "123456789";
  CHECK(crc32c(crc32c_path::portable, check, 9) == 0xE3069283u);
  CHECK(crc32c(crc32c_path::hardware, check, 9) == 0xE3069283u);
  CHECK(crc32c(check, 0) == 0u);
  // 32 bytes of zeros and of ones (RFC 3720, B.4).
  const std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF);
  CHECK(crc32c(crc32c_path::portable, zeros.data(), 32) == 0x8A9136AAu);
  CHECK(crc32c(crc32c_path::hardware, ones.data(), 32) == 0x62A8AB43u);
  MESSAGE("hardware CRC-32C path available: " << cgx::detail::crc32c_hardware_available());

  std::mt19937_64 g(7);
  std::vector<unsigned char> buf(3 * 3 * 4096 + 100);  // spans the three-stream blocks
  for (auto& b : buf) b = static_cast<unsigned char>(g());
  std::vector<std::size_t> lengths{0, 1, 7, 8, 9, 63, 64, 4095, 4096, 12287, 12288, 12289, 24576 + 5, buf.size() - 64};
  for (std::size_t k = 0; k < 40; ++k) lengths.push_back(static_cast<std::size_t>(g() % (buf.size() - 64)));
  for (std::size_t n : lengths)
    for (std::size_t off : {0, 1, 3, 8, 13}) {
      const unsigned char* p = buf.data() + off;
      const std::uint32_t want = crc32c_bitwise(p, n);
      INFO("n = " << n << ", offset " << off);
      CHECK(crc32c(crc32c_path::portable, p, n) == want);
      CHECK(crc32c(crc32c_path::hardware, p, n) == want);
      const std::size_t cut = n / 3;  // continuing from the checksum of a prefix
      CHECK(crc32c(p + cut, n - cut, crc32c(p, cut)) == want);
    }
  // One flipped bit anywhere changes it.
  const std::uint32_t whole = crc32c(buf.data(), buf.size());
  for (std::size_t at : {std::size_t{0}, std::size_t{4096}, buf.size() / 2, buf.size() - 1}) {
    buf[at] ^= 0x04;
    CHECK(crc32c(buf.data(), buf.size()) != whole);
    buf[at] ^= 0x04;
  }
}
