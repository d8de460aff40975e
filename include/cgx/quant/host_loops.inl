// host_loops.inl: the bucket loops of cgx::quant::maxmin's host compress and decode.
// No include guard: quant/host_simd.hpp includes this file once per instruction set,
// inside that set's namespace (after its `struct kernels`), so that the loop, the
// bucket parameters and the kernels compile into one function per instruction set.

template <int Bits, bool Add, class T>
void decode_buckets(const std::byte* in, std::size_t n, std::size_t bucket, T* out, std::size_t b0, std::size_t b1);

/// Compresses buckets [b0, b1) of in[0..n) into out (the whole compressed buffer of
/// buckets of `bucket` values: wire_layout<Bits, bucket>). The bucket size is an argument,
/// not a template parameter: the kernels depend on it only through loop bounds, so one
/// compiled loop per (Bits, Rounding, T, instruction set) serves every bucket size.
/// While bucket b is encoded, bucket b + ahead of in is prefetched when it is a full one:
/// a caller that works through buckets in blocks of `ahead` (add_requantize) pulls its
/// next block in while this one is computed. Prefetching changes no byte written.
/// `back`, when not null (it may be `in`), receives the decoded values of buckets
/// [b0, b1): what decode_buckets of `out` would write there, the same bits. Full buckets
/// are decoded from the codes still in registers (the kernels' `back`), the others by
/// decode_buckets right after their encoding.
template <int Bits, class Rounding, class T>
void compress_buckets(const T* in, std::size_t n, std::size_t bucket, std::byte* out, const rng_state& rng,
                      std::size_t b0, std::size_t b1, std::size_t ahead = 1, T* back = nullptr) {
  using M = meta_t<T>;
  auto* codes_base = reinterpret_cast<std::uint8_t*>(out) + detail::meta_bytes<M>(n, bucket);
  const std::size_t bucket_code_bytes = static_cast<std::size_t>(Bits) * (bucket / 8);
  for (std::size_t b = b0; b < b1; ++b) {
    const std::size_t first = b * bucket;
    const std::size_t count = n - first < bucket ? n - first : bucket;
    const auto S = static_cast<std::uint32_t>((count + 7) / 8);
    const T* x = in + first;
    std::uint8_t* codes = codes_base + b * bucket_code_bytes;
    M mn, mx;
    bool finite;
    kernels::bucket_minmax<M>(x, count, mn, mx, finite);
    const bucket_params<M> p = make_bucket_params<Bits, M>(mn, mx, finite);
    detail::store_meta<M>(out, b, p.min, p.unit);
    if (!p.finite) {
      std::memset(codes, 0, static_cast<std::size_t>(Bits) * S);
      if (back != nullptr) decode_buckets<Bits, false, T>(out, n, bucket, back, b, b + 1);
      continue;
    }
    const std::uint64_t gfirst = rng.position + first;
    if (p.wide) {  // values near the limits of M: rare, scalar
      detail::host_encode_bucket<Bits, Rounding, true, false, T, M, true>(x, count, S, 0, p.min, p.inv, codes, rng,
                                                                          gfirst);
    } else if (count == bucket) {
      const T* next = (b + ahead + 1) * bucket <= n ? x + ahead * bucket : nullptr;
      const M scale = p.scaled ? detail::rescale_factor<M>() : M(1);
      T* kb = back != nullptr ? back + first : nullptr;  // T is M here (float or double)
      const std::uint32_t j0 =
          kernels::bucket_encode<Bits, Rounding, M>(x, S, p.min, p.inv, scale, codes, rng, gfirst, next, kb, p.unit);
      if (j0 < S) {
        if (!p.scaled)
          detail::host_encode_bucket<Bits, Rounding, false, false>(x, count, S, j0, p.min, p.inv, codes, rng, gfirst);
        else
          detail::host_encode_bucket<Bits, Rounding, false, true>(x, count, S, j0, p.min, p.inv, codes, rng, gfirst);
      }
      if (kb != nullptr && j0 < S)
        detail::host_decode_bucket<Bits, false, false>(codes, count, S, j0, p.min, p.unit, kb);
      continue;
    } else if (!p.scaled) {
      detail::host_encode_bucket<Bits, Rounding, true, false>(x, count, S, 0, p.min, p.inv, codes, rng, gfirst);
    } else {
      detail::host_encode_bucket<Bits, Rounding, true, true>(x, count, S, 0, p.min, p.inv, codes, rng, gfirst);
    }
    if (back != nullptr) decode_buckets<Bits, false, T>(out, n, bucket, back, b, b + 1);
  }
}

/// Decodes buckets [b0, b1) of the compressed buffer `in` of n values (buckets of
/// `bucket` values) into out (Add: out += decoded).
template <int Bits, bool Add, class T>
void decode_buckets(const std::byte* in, std::size_t n, std::size_t bucket, T* out, std::size_t b0,
                    std::size_t b1) {
  using M = meta_t<T>;
  const auto* codes_base = reinterpret_cast<const std::uint8_t*>(in) + detail::meta_bytes<M>(n, bucket);
  const std::size_t bucket_code_bytes = static_cast<std::size_t>(Bits) * (bucket / 8);
  for (std::size_t b = b0; b < b1; ++b) {
    const std::size_t first = b * bucket;
    const std::size_t count = n - first < bucket ? n - first : bucket;
    const auto S = static_cast<std::uint32_t>((count + 7) / 8);
    M mn, unit;
    detail::load_meta<M>(in, b, mn, unit);
    const std::uint8_t* codes = codes_base + b * bucket_code_bytes;
    if (is_wide<Bits, M>(mn, unit)) {  // values near the limits of M: rare, scalar
      detail::host_decode_bucket<Bits, Add, true, T, M, true>(codes, count, S, 0, mn, unit, out + first);
    } else if (count == bucket) {
      const T* next = b + 1 < b1 ? out + first + bucket : nullptr;
      const std::uint32_t j0 = kernels::bucket_decode<Bits, Add, M>(codes, S, mn, unit, out + first, next);
      detail::host_decode_bucket<Bits, Add, false>(codes, count, S, j0, mn, unit, out + first);
    } else {
      detail::host_decode_bucket<Bits, Add, true>(codes, count, S, 0, mn, unit, out + first);
    }
  }
}
