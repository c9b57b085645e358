#!/usr/bin/python3
"""Writes tests/data/torch_conversions.bin: FP32 inputs and PyTorch's BF16 and FP16 conversions.

Run with Debian's python3-torch: /usr/bin/python3 tests/sync/make_torch_reference.py
Layout (little-endian): u32 count, count x f32 inputs, count x u16 bf16, count x u16 f16.
NaN inputs are left out: PyTorch's own scalar and vector paths disagree on NaN payloads.
"""
import os
import struct

import numpy as np
import torch

rng = np.random.default_rng(20261129)
patterns = []
# Signed zeros, infinities, the extremes, and the FP32 subnormal range.
patterns += [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF,
             0x00000001, 0x80000001, 0x007FFFFF, 0x00800000]
# BF16 ties and near-ties: low 16 bits at 0x7FFF, 0x8000, 0x8001 on even and odd high halves.
for high in rng.integers(0, 0x7F80, 600):
    for low in (0x7FFF, 0x8000, 0x8001, 0x0000, 0xFFFF):
        for sign in (0, 0x8000):
            patterns.append(((int(high) | sign) << 16) | low)
# FP16 ties and boundaries: low 13 bits at the midpoint, across normal and subnormal FP16 range.
for value in rng.uniform(-70000, 70000, 400).astype(np.float32).view(np.uint32):
    for low in (0x0FFF, 0x1000, 0x1001):
        patterns.append((int(value) & ~0x1FFF) | low)
for exponent in range(100, 145):  # around FP16's subnormal and normal range
    for mantissa in rng.integers(0, 1 << 23, 40):
        for sign in (0, 1):
            patterns.append((sign << 31) | (exponent << 23) | int(mantissa))
for value in (65504.0, 65519.0, 65519.996, 65520.0, 65536.0, 2.0**-24, 2.0**-25, 2.0**-14,
              1.5 * 2.0**-25, 3.0 * 2.0**-26):
    for sign in (1, -1):
        patterns.append(int(np.array([sign * value], dtype=np.float32).view(np.uint32)[0]))
# Random bit patterns and weight-like values.
patterns += [int(p) for p in rng.integers(0, 1 << 32, 12000, dtype=np.uint64)]
patterns += [int(p) for p in rng.normal(0, 0.02, 4000).astype(np.float32).view(np.uint32)]

bits = np.array(patterns, dtype=np.uint32)
values = bits.view(np.float32)
values = values[~np.isnan(values)]
tensor = torch.from_numpy(values.copy())
bf16 = tensor.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
f16 = tensor.to(torch.float16).view(torch.int16).numpy().view(np.uint16)

out = os.path.join(os.path.dirname(__file__), "..", "data", "torch_conversions.bin")
with open(out, "wb") as f:
    f.write(struct.pack("<I", len(values)))
    f.write(values.astype("<f4").tobytes())
    f.write(bf16.astype("<u2").tobytes())
    f.write(f16.astype("<u2").tobytes())
print(f"wrote {len(values)} conversions to {os.path.normpath(out)} (torch {torch.__version__})")
