"""Publishing from Python against the C++ publisher on the same tensors, in the same run.

Builds a decoder-shaped FP32 model (100M parameters by default: 8 layers of d_model 1024), takes
Adam-like steps at a fine-tuning learning rate, and writes every version as an FP32 safetensors
file. Then, on those same versions:

  - python:     weft.Publisher(...).start(v0), .publish(v1), ... from torch tensors held in memory
                (the state dict updated in place, as a trainer's is);
  - c++:        bench/publish_bench (trainer_adapter::Publisher) on the same files, read into
                memory before each publish is timed;
  - torch.save: the BF16 copy a trainer would otherwise write for its engines, cast and saved.

Goal: python <= 1.1x c++. It also prints the peak anonymous memory of each Python publish above
what the process held before it, against the served model plus the delta (goal: at most 1.1x).
Run from the repository root after ./setup.sh:

    /usr/bin/python3 bench/python_publish_bench.py [--params 100e6] [--versions 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

# torch's OpenMP threads busy-wait after every parallel operation; on a small machine they would
# take the cores from the publisher's encoding threads right after the state dict is updated.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build" / "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import weft  # noqa: E402


def shapes(params: float):
    """Layers of d_model d (q, k, v, o of d x d; up, down of d x 4d) adding up to ~params."""
    d = 1024
    layers = max(1, round(params / (12 * d * d)))
    out = {}
    for i in range(layers):
        for name in ("q", "k", "v", "o"):
            out[f"layers.{i}.attn.{name}"] = (d, d)
        out[f"layers.{i}.mlp.up"] = (d, 4 * d)
        out[f"layers.{i}.mlp.down"] = (4 * d, d)
    return out


def write_safetensors(path: pathlib.Path, tensors: dict) -> None:
    header, offset = {}, 0
    for name, t in tensors.items():
        size = t.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for t in tensors.values():
            f.write(t.numpy().tobytes())


def read_into(path: pathlib.Path, tensors: dict) -> None:
    data = bytearray(path.read_bytes())
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = memoryview(data)[8 + length:]
    for name, t in tensors.items():
        begin, end = header[name]["data_offsets"]
        t.copy_(torch.frombuffer(body[begin:end], dtype=torch.float32).view(t.shape))


def anonymous_bytes() -> int:
    """This process's anonymous resident memory (RssAnon of /proc/self/status), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakAnonymous:
    """The peak of anonymous memory above what the process held at the start of a ``with``,
    sampled every 2 ms by a thread (the publisher releases the GIL while it works)."""

    def __enter__(self):
        self.before = anonymous_bytes()
        self.peak = self.before
        self._stop = False
        self._thread = threading.Thread(target=self._sample)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop:
            self.peak = max(self.peak, anonymous_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc) -> None:
        self._stop = True
        self._thread.join()
        self.peak = max(self.peak, anonymous_bytes())

    @property
    def above(self) -> int:
        return self.peak - self.before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=100e6)
    parser.add_argument("--versions", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=2e-6, help="Adam step size per element")
    parser.add_argument("--publish-bench", default=str(ROOT / "build" / "bench" / "publish_bench"))
    parser.add_argument("--dir", help="scratch directory (default: a temporary one)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    scratch = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="weft-publish-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        g = torch.Generator().manual_seed(1)
        model = {n: torch.randn(s, generator=g) * 0.02 for n, s in shapes(args.params).items()}
        params = sum(t.numel() for t in model.values())
        files = []
        for v in range(args.versions):
            if v > 0:  # an Adam-like step: about the learning rate for every element
                for t in model.values():
                    t.add_(torch.randn(t.shape, generator=g).sign_().mul_(args.lr))
            files.append(scratch / f"v{v}.safetensors")
            write_safetensors(files[-1], model)
        print(f"model: {params / 1e6:.1f}M FP32 parameters ({params * 4 / 1e9:.2f} GB), served "
              f"as BF16; {args.versions} versions; {args.threads} threads")

        # C++.
        cpp = subprocess.run([args.publish_bench, str(scratch / "store-cpp"), "run",
                              str(args.threads)] + [str(f) for f in files],
                             check=True, capture_output=True, text=True).stdout
        cpp_rows = [json.loads(line) for line in cpp.splitlines()]

        # Python, on tensors held in memory and updated in place.
        publisher = weft.Publisher(scratch / "store-python", "run", threads=args.threads)
        py_rows = []
        for v, f in enumerate(files):
            read_into(f, model)
            started = time.perf_counter()
            with PeakAnonymous() as memory:
                result = publisher.start(model) if v == 0 else publisher.publish(model)
            py_rows.append({"seconds": time.perf_counter() - started,
                            "bytes_written": result.bytes_written, "density": result.density,
                            "above": memory.above})

        # torch.save of the BF16 copy.
        save_rows = []
        for v, f in enumerate(files):
            read_into(f, model)
            started = time.perf_counter()
            torch.save({n: t.to(torch.bfloat16) for n, t in model.items()}, scratch / "bf16.pt")
            save_rows.append(time.perf_counter() - started)
            save_bytes = (scratch / "bf16.pt").stat().st_size

        print(f"{'version':>7} {'density':>8} {'python s':>9} {'c++ s':>8} {'python/c++':>10} "
              f"{'bytes':>11} {'torch.save s':>12} {'save bytes':>11}")
        for v in range(args.versions):
            p, c = py_rows[v], cpp_rows[v]
            print(f"{v:>7} {p['density']:>8.4f} {p['seconds']:>9.3f} {c['seconds']:>8.3f} "
                  f"{p['seconds'] / c['seconds']:>9.2f}x {p['bytes_written']:>11} "
                  f"{save_rows[v]:>12.3f} {save_bytes:>11}")
        later = range(1, args.versions)
        if later:
            py = sum(py_rows[v]["seconds"] for v in later)
            cc = sum(cpp_rows[v]["seconds"] for v in later)
            sv = sum(save_rows[v] for v in later)
            print(f"deltas (versions 1-{args.versions - 1}): python {py:.3f} s, c++ {cc:.3f} s, "
                  f"ratio {py / cc:.3f} (goal <= 1.1); torch.save of the BF16 copy {sv:.3f} s "
                  f"({sv / py:.2f}x python's time)")
        # Memory: a publish holds the served copy (kept from the last call) and takes its peak
        # above that; the goal is the served model plus the delta plus 10%.
        served = params * 2
        print(f"memory (served BF16 {served / 1e9:.3f} GB): start peaked "
              f"{py_rows[0]['above'] / 1e9:.3f} GB above the masters "
              f"({py_rows[0]['above'] / served:.2f}x the served model)")
        for v in later:
            p = py_rows[v]
            held = served + p["above"]
            print(f"  version {v}: served + publish peak {held / 1e9:.3f} GB = "
                  f"{held / (served + p['bytes_written']):.3f}x (served + delta "
                  f"{(served + p['bytes_written']) / 1e9:.3f} GB); goal <= 1.1x")
        same = all(p["bytes_written"] == c["bytes_written"] for p, c in zip(py_rows, cpp_rows))
        print("python and c++ wrote the same bytes: " + ("yes" if same else "NO"))
        return 0 if same else 1
    finally:
        if not args.dir:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
