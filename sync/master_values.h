// Master weights as a trainer holds them, read in place and never copied: FP32, or BF16 (the bit
// patterns of a trainer that keeps BF16 master weights). Serving a BF16 master widens each element
// to FP32 first, which is exact, so every serving format rounds it as it would round the same FP32
// values (and BF16 served from a BF16 master is the master's bits unchanged).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sync/dtype.h"

namespace weft::sync {

class MasterValues {
 public:
  MasterValues() = default;
  // FP32 master weights (implicit: an FP32 span is the common case).
  MasterValues(std::span<const float> f32)  // NOLINT(google-explicit-constructor)
      : data_(f32.data()), size_(f32.size()), dtype_(DType::kF32) {}
  MasterValues(const std::vector<float>& f32)  // NOLINT(google-explicit-constructor)
      : MasterValues(std::span<const float>(f32)) {}
  static MasterValues Bf16(std::span<const uint16_t> bits) {
    MasterValues values;
    values.data_ = bits.data();
    values.size_ = bits.size();
    values.dtype_ = DType::kBF16;
    return values;
  }

  DType dtype() const { return dtype_; }  // kF32 or kBF16
  bool is_f32() const { return dtype_ == DType::kF32; }
  uint64_t size() const { return size_; }
  // The values as they are held: f32() only when is_f32(), bf16() only when not.
  std::span<const float> f32() const { return {static_cast<const float*>(data_), size_}; }
  std::span<const uint16_t> bf16() const { return {static_cast<const uint16_t*>(data_), size_}; }
  MasterValues subspan(uint64_t first, uint64_t count) const {
    MasterValues part = *this;
    part.data_ = static_cast<const uint8_t*>(data_) + first * (is_f32() ? 4 : 2);
    part.size_ = count;
    return part;
  }

 private:
  const void* data_ = nullptr;
  uint64_t size_ = 0;
  DType dtype_ = DType::kF32;
};

// Calls fn(std::span<const float> block, uint64_t first) over consecutive blocks of `values`
// widened to FP32 (at most `kWidenBlock` elements each, for BF16; one block, in place, for FP32).
inline constexpr uint64_t kWidenBlock = 1024;
template <typename Fn>
void ForEachFloatBlock(const MasterValues& values, Fn&& fn) {
  if (values.is_f32()) {
    if (values.size() > 0) fn(values.f32(), uint64_t{0});
    return;
  }
  alignas(64) float widened[kWidenBlock];
  const std::span<const uint16_t> bits = values.bf16();
  for (uint64_t first = 0; first < bits.size(); first += kWidenBlock) {
    const uint64_t n = bits.size() - first < kWidenBlock ? bits.size() - first : kWidenBlock;
    for (uint64_t i = 0; i < n; ++i) {
      const uint32_t wide = uint32_t{bits[first + i]} << 16;
      __builtin_memcpy(&widened[i], &wide, sizeof(float));
    }
    fn(std::span<const float>(widened, n), first);
  }
}

}  // namespace weft::sync
