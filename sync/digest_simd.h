// Internal: the state digest's element changes (digest.h) on eight 64-bit lanes with AVX-512, for
// digest.cc and for kernels that update a digest while they go (call only where Cpu().avx512
// holds, from functions marked WEFT_TARGET_AVX512), and its terms on four lanes with AVX2, whose
// 64-bit multiplications are made of three 32-bit ones (only where Cpu().avx2 holds, from
// functions marked WEFT_TARGET_AVX2). Use digest.h instead.
#pragma once

#if defined(__x86_64__)

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
// GCC 12's AVX-512 intrinsics start from an "undefined" register, which -Wmaybe-uninitialized
// and -Wuninitialized report at every use (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include <cstdint>

#include "sync/cpu.h"
#include "sync/digest.h"

namespace weft::sync::digest_detail {

// Mix on eight 64-bit lanes.
template <int kShift1, uint64_t kMultiply1, int kShift2, uint64_t kMultiply2, int kShift3>
WEFT_TARGET_AVX512 inline __m512i Mix8(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi64(x, kShift1));
  x = _mm512_mullo_epi64(x, _mm512_set1_epi64(static_cast<long long>(kMultiply1)));
  x = _mm512_xor_si512(x, _mm512_srli_epi64(x, kShift2));
  x = _mm512_mullo_epi64(x, _mm512_set1_epi64(static_cast<long long>(kMultiply2)));
  return _mm512_xor_si512(x, _mm512_srli_epi64(x, kShift3));
}

WEFT_TARGET_AVX512 inline __m512i MixA8(__m512i x) {
  return Mix8<30, 0xBF58476D1CE4E5B9ull, 27, 0x94D049BB133111EBull, 31>(x);
}

WEFT_TARGET_AVX512 inline __m512i MixB8(__m512i x) {
  return Mix8<33, 0xFF51AFD7ED558CCDull, 33, 0xC4CEB9FE1A85EC53ull, 33>(x);
}

// The digest change of eight elements, added lane by lane to `sum`: element index[i] went from
// before[i] to after[i] (zero-extended bit patterns). Equals ElementChange for each lane.
struct DigestLanes {
  __m512i lane0;
  __m512i lane1;
};

WEFT_TARGET_AVX512 inline DigestLanes ZeroLanes() {
  return {_mm512_setzero_si512(), _mm512_setzero_si512()};
}

// The position keys of eight tensor indices (digest_detail::PositionKey on each lane).
WEFT_TARGET_AVX512 inline __m512i PositionKeys8(__m512i index) {
  return MixA8(
      _mm512_xor_si512(index, _mm512_set1_epi64(static_cast<long long>(0x5EED0F5EED0F5EEDull))));
}

// Term(key, value) on eight lanes: position keys (PositionKeys8) and zero-extended bit patterns.
WEFT_TARGET_AVX512 inline DigestLanes ElementTerms8(__m512i key, __m512i value) {
  const __m512i key_factor = _mm512_set1_epi64(static_cast<long long>(0x9E3779B97F4A7C15ull));
  const __m512i value_factor = _mm512_set1_epi64(static_cast<long long>(0xD6E8FEB86659FD93ull));
  return {MixB8(_mm512_xor_si512(key, value)),
          MixA8(_mm512_xor_si512(_mm512_mullo_epi64(key, key_factor),
                                 _mm512_mullo_epi64(value, value_factor)))};
}

// AddElementChanges8 from the position keys (PositionKeys8) instead of the indices: a chain of
// three dependent multiplications rather than five, for kernels that compute the keys a step
// ahead so as to keep the chains they leave in flight short.
WEFT_TARGET_AVX512 inline void AddElementChangesWithKeys8(__m512i key, __m512i before,
                                                          __m512i after, DigestLanes* sum) {
  const DigestLanes now = ElementTerms8(key, after), was = ElementTerms8(key, before);
  sum->lane0 = _mm512_add_epi64(sum->lane0, _mm512_sub_epi64(now.lane0, was.lane0));
  sum->lane1 = _mm512_add_epi64(sum->lane1, _mm512_sub_epi64(now.lane1, was.lane1));
}

WEFT_TARGET_AVX512 inline void AddElementChanges8(__m512i index, __m512i before, __m512i after,
                                                  DigestLanes* sum) {
  AddElementChangesWithKeys8(PositionKeys8(index), before, after, sum);
}

WEFT_TARGET_AVX512 inline Digest ReduceLanes(const DigestLanes& sum) {
  return Digest{static_cast<uint64_t>(_mm512_reduce_add_epi64(sum.lane0)),
                static_cast<uint64_t>(_mm512_reduce_add_epi64(sum.lane1))};
}

// The same on four lanes with AVX2. a * b mod 2^64 from 32-bit halves: lo(a) lo(b) + ((hi(a) lo(b)
// + lo(a) hi(b)) << 32).
WEFT_TARGET_AVX2 inline __m256i Multiply4(__m256i a, __m256i b) {
  const __m256i low = _mm256_mul_epu32(a, b);
  const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
                                         _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
  return _mm256_add_epi64(low, _mm256_slli_epi64(cross, 32));
}

template <int kShift1, uint64_t kMultiply1, int kShift2, uint64_t kMultiply2, int kShift3>
WEFT_TARGET_AVX2 inline __m256i Mix4(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi64(x, kShift1));
  x = Multiply4(x, _mm256_set1_epi64x(static_cast<long long>(kMultiply1)));
  x = _mm256_xor_si256(x, _mm256_srli_epi64(x, kShift2));
  x = Multiply4(x, _mm256_set1_epi64x(static_cast<long long>(kMultiply2)));
  return _mm256_xor_si256(x, _mm256_srli_epi64(x, kShift3));
}

WEFT_TARGET_AVX2 inline __m256i MixA4(__m256i x) {
  return Mix4<30, 0xBF58476D1CE4E5B9ull, 27, 0x94D049BB133111EBull, 31>(x);
}

WEFT_TARGET_AVX2 inline __m256i MixB4(__m256i x) {
  return Mix4<33, 0xFF51AFD7ED558CCDull, 33, 0xC4CEB9FE1A85EC53ull, 33>(x);
}

struct DigestLanes4 {
  __m256i lane0;
  __m256i lane1;
};

WEFT_TARGET_AVX2 inline __m256i PositionKeys4(__m256i index) {
  return MixA4(
      _mm256_xor_si256(index, _mm256_set1_epi64x(static_cast<long long>(0x5EED0F5EED0F5EEDull))));
}

WEFT_TARGET_AVX2 inline DigestLanes4 ElementTerms4(__m256i key, __m256i value) {
  const __m256i key_factor = _mm256_set1_epi64x(static_cast<long long>(0x9E3779B97F4A7C15ull));
  const __m256i value_factor = _mm256_set1_epi64x(static_cast<long long>(0xD6E8FEB86659FD93ull));
  return {MixB4(_mm256_xor_si256(key, value)),
          MixA4(_mm256_xor_si256(Multiply4(key, key_factor), Multiply4(value, value_factor)))};
}

WEFT_TARGET_AVX2 inline Digest ReduceLanes4(const DigestLanes4& sum) {
  alignas(32) uint64_t lane0[4], lane1[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lane0), sum.lane0);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lane1), sum.lane1);
  return Digest{lane0[0] + lane0[1] + lane0[2] + lane0[3],
                lane1[0] + lane1[1] + lane1[2] + lane1[3]};
}

}  // namespace weft::sync::digest_detail

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // __x86_64__
