// The state digest of a served tensor: a 128-bit additive hash over (position, value) pairs.
//
//   Digest(T) = Base(n, dtype) + sum over i of Term(i, element_i)    (two lanes, each mod 2^64)
//
// Because the sum is commutative and invertible, applying a delta updates the digest in
// O(changed elements): D' = D - Term(i, old) + Term(i, new) for each changed i, and the result
// equals a full recomputation bit for bit. Chunks can be hashed in parallel and added.
//
// What it detects (docs/formats.md, "State digest"): Term(i, x) is, for a fixed position i, a
// bijection of the element's bit pattern in each lane, so any single changed element always
// changes the digest. Any other accidental difference (several elements, moved or swapped values,
// a different length or dtype) goes undetected only if both 64-bit lanes cancel at once, about
// 2^-128 for errors unrelated to the hash. It is not a cryptographic commitment: an adversary who
// can choose many (position, value) pairs can find collisions of additive hashes with generalised
// birthday attacks, so blobs travelling between parties are protected by their content hashes,
// and the digest proves that a worker's bytes equal the publisher's, not that either is honest.
//
// Elements are hashed by their stored bit pattern (1, 2 or 4 bytes, little-endian), so every NaN
// payload, both zeros and every subnormal are distinct. The unit is the codec's coded unit
// (CodedWidth): the element itself, except for bytewise-coded dtypes, which are hashed per byte.
// All functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "sync/dtype.h"

namespace weft::sync {

struct Digest {
  uint64_t lane0 = 0;
  uint64_t lane1 = 0;

  Digest& operator+=(const Digest& other) {
    lane0 += other.lane0;
    lane1 += other.lane1;
    return *this;
  }
  Digest& operator-=(const Digest& other) {
    lane0 -= other.lane0;
    lane1 -= other.lane1;
    return *this;
  }
  friend Digest operator+(Digest a, const Digest& b) { return a += b; }
  friend Digest operator-(Digest a, const Digest& b) { return a -= b; }
  friend bool operator==(const Digest&, const Digest&) = default;

  // 32 lowercase hex digits, lane0 first, each big-endian.
  std::string ToHex() const;
  static std::optional<Digest> FromHex(std::string_view hex);
};

namespace digest_detail {

// xorshift-multiply-xorshift-multiply-xorshift: a bijection of 64-bit words for any odd
// multipliers. The two instances below use unrelated published constants.
template <int kShift1, uint64_t kMultiply1, int kShift2, uint64_t kMultiply2, int kShift3>
inline uint64_t Mix(uint64_t x) {
  x ^= x >> kShift1;
  x *= kMultiply1;
  x ^= x >> kShift2;
  x *= kMultiply2;
  x ^= x >> kShift3;
  return x;
}

inline uint64_t MixA(uint64_t x) {  // the splitmix64 finaliser
  return Mix<30, 0xBF58476D1CE4E5B9ull, 27, 0x94D049BB133111EBull, 31>(x);
}

inline uint64_t MixB(uint64_t x) {  // murmur3's fmix64
  return Mix<33, 0xFF51AFD7ED558CCDull, 33, 0xC4CEB9FE1A85EC53ull, 33>(x);
}

inline uint64_t PositionKey(uint64_t index) { return MixA(index ^ 0x5EED0F5EED0F5EEDull); }

}  // namespace digest_detail

// Term(i, value) for a position key k = PositionKey(i). Both lanes are bijective in `value`.
inline Digest ElementTerm(uint64_t position_key, uint64_t value) {
  using namespace digest_detail;
  return Digest{MixB(position_key ^ value),
                MixA((position_key * 0x9E3779B97F4A7C15ull) ^ (value * 0xD6E8FEB86659FD93ull))};
}

// The change of the digest when element `index` goes from `old_value` to `new_value`.
inline Digest ElementChange(uint64_t index, uint64_t old_value, uint64_t new_value) {
  uint64_t key = digest_detail::PositionKey(index);
  return ElementTerm(key, new_value) - ElementTerm(key, old_value);
}

// The digest change of n changed elements: element first + offsets[j] went from old_values[j] to
// new_values[j] (first + offset wraps modulo 2^64, so `first` may be an index base minus an
// offset base). Uses AVX-512 or AVX2 when available; SumElementChangesRef is the scalar reference.
Digest SumElementChanges(uint64_t first, const uint32_t* offsets, const uint32_t* old_values,
                         const uint32_t* new_values, size_t n);
Digest SumElementChangesRef(uint64_t first, const uint32_t* offsets, const uint32_t* old_values,
                            const uint32_t* new_values, size_t n);

// Base(n, dtype): the digest of a tensor before any element is added.
Digest BaseDigest(uint64_t element_count, DType dtype);

// Sum of Term(first_index + j, element j) over `bytes`, viewed as elements of `element_size` bytes.
// Uses AVX-512 or AVX2 when available; ElementsDigestRef is the scalar reference.
Digest ElementsDigest(std::span<const uint8_t> bytes, uint8_t element_size, uint64_t first_index);
Digest ElementsDigestRef(std::span<const uint8_t> bytes, uint8_t element_size,
                         uint64_t first_index);

// The full digest of a tensor (n = bytes.size() / CodedWidth(dtype) units), on up to `threads`
// threads.
Digest TensorDigest(DType dtype, std::span<const uint8_t> bytes, int threads = 1);

}  // namespace weft::sync
