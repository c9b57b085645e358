"""The weft Python package against the real thing: the C++ store reader, a live orchestrator,
several processes. Bit-exactness is checked against torch's own casts (BF16, FP16) and an
independent FP8 reference written here from the formats' definitions."""

from __future__ import annotations

import json
import os
import pathlib
import struct
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

import weft
from weft.publisher import inspect_tensors


# --- helpers ---------------------------------------------------------------------------------

def read_safetensors(path: pathlib.Path) -> dict:
    """name -> (dtype, shape, raw bytes) of a safetensors file."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = data[8 + length:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        out[name] = (entry["dtype"], entry["shape"], body[begin:end])
    return out


def pull(weft_bin: str, store: pathlib.Path, run: str, version: int, out: pathlib.Path) -> dict:
    subprocess.run([weft_bin, "store", "pull", "--store", str(store), "--run", run, "--version",
                    str(version), "-o", str(out)], check=True, capture_output=True)
    return read_safetensors(out)


def bits(tensor: torch.Tensor) -> bytes:
    """The raw bytes of a CPU tensor (through a same-width integer view)."""
    view = {2: torch.int16, 4: torch.int32}[tensor.element_size()]
    return tensor.contiguous().view(view).numpy().tobytes()


def assert_served(raw: bytes, master: torch.Tensor, cast: torch.dtype, name: str) -> None:
    """The served bytes are torch's cast of the master, bit for bit, except that a NaN need only
    stay a NaN of the same sign (docs/formats.md: torch's own scalar and vector casts disagree on
    NaN payloads)."""
    served = torch.frombuffer(bytearray(raw), dtype=torch.int16).view(cast).reshape(master.shape)
    expected = master.to(cast)
    nan = torch.isnan(master)
    assert torch.equal(served[~nan].view(torch.int16), expected[~nan].view(torch.int16)), name
    assert torch.isnan(served[nan]).all(), name
    assert torch.equal(torch.signbit(served[nan].float()), torch.signbit(master[nan].float())), name


def fp8_codes(values: np.ndarray, fmt: str) -> np.ndarray:
    """Round-to-nearest-even FP8 codes of float32 `values`, saturating to the largest finite
    value (as __nv_cvt_float_to_fp8 with __NV_SATFINITE does), NaN to NaN. Built from the code
    table: every code's value, then the nearest one, ties to the even code."""
    exp_bits, man_bits = (4, 3) if fmt == "e4m3" else (5, 2)
    bias = (1 << (exp_bits - 1)) - 1
    table = []
    for code in range(1 << (exp_bits + man_bits)):
        e, m = code >> man_bits, code & ((1 << man_bits) - 1)
        if fmt == "e4m3" and e == 15 and m == 7:
            continue  # NaN
        if fmt == "e5m2" and e == 31:
            continue  # infinities and NaN
        value = (m / (1 << man_bits)) * 2.0 ** (1 - bias) if e == 0 else \
            (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
        table.append((value, code))
    table.sort()
    magnitudes = np.array([v for v, _ in table])
    codes = np.array([c for _, c in table])
    x = np.abs(values.astype(np.float64))
    x = np.minimum(x, magnitudes[-1])
    hi = np.clip(np.searchsorted(magnitudes, x), 1, len(magnitudes) - 1)
    lo = hi - 1
    d_lo, d_hi = x - magnitudes[lo], magnitudes[hi] - x
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (codes[hi] % 2 == 0))
    out = np.where(pick_hi, codes[hi], codes[lo]).astype(np.uint8)
    out |= (np.signbit(values).astype(np.uint8) << 7)
    nan_code = 0x7F if fmt == "e4m3" else 0x7E
    return np.where(np.isnan(values), nan_code | (np.signbit(values).astype(np.uint8) << 7), out)


def fp8_reference(weights: torch.Tensor, fmt: str, block: int):
    """(codes, scales) as weft serves `weights` (2-D float32) in FP8 with `block` tiles."""
    w = weights.numpy().astype(np.float32)
    rows, cols = w.shape
    max_finite = np.float32(448.0 if fmt == "e4m3" else 57344.0)
    b = block if block else max(rows, cols)
    tiles_r, tiles_c = -(-rows // b), -(-cols // b)
    scales = np.ones((tiles_r, tiles_c), dtype=np.float32)
    codes = np.zeros(w.shape, dtype=np.uint8)
    for i in range(tiles_r):
        for j in range(tiles_c):
            tile = w[i * b:(i + 1) * b, j * b:(j + 1) * b]
            amax = np.float32(np.max(np.abs(tile)))
            scale = np.float32(1.0) if amax == 0 else np.float32(amax / max_finite)
            scales[i, j] = scale
            codes[i * b:(i + 1) * b, j * b:(j + 1) * b] = fp8_codes(
                (tile / scale).astype(np.float32), fmt)
    return codes, (scales if block else scales.reshape(()))


def model(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    sd = {
        "embed": torch.randn(64, 48, generator=g) * 0.02,
        "layer.weight": torch.randn(48, 96, generator=g) * 0.02,
        "layer.bias": torch.zeros(96),
        "norm": torch.ones(48),
    }
    sd["layer.weight"].requires_grad_(True)  # parameters usually require gradients
    return sd


def step(sd: dict, seed: int, size: float = 3e-4) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in sd.values():
            t.add_(torch.randn(t.shape, generator=g).to(t.dtype) * size)


# --- publishing ------------------------------------------------------------------------------

@pytest.mark.parametrize("serving,delta_mode",
                         [("bf16", "plain"), ("fp16", "plain"), ("bf16", "context")])
def test_published_versions_are_torch_casts_bit_for_bit(weft_bin, tmp_path, serving, delta_mode):
    sd = model()
    # Special values: infinities, signed zero, NaN, a BF16 subnormal, values on rounding ties.
    with torch.no_grad():
        sd["embed"][0, :6] = torch.tensor([float("inf"), float("-inf"), -0.0, float("nan"),
                                           1e-40, 1.0 + 2.0 ** -8])
    sd["bf16_master"] = (torch.randn(32, 16) * 0.02).to(torch.bfloat16)
    publisher = weft.Publisher(tmp_path / "store", "run", serving=serving, delta_mode=delta_mode)
    first = publisher.start(sd)
    assert first.version == 0 and first.keyframe and first.density == 1.0
    assert first.bytes_written == first.keyframe_bytes > first.served_bytes
    cast = torch.bfloat16 if serving == "bf16" else torch.float16
    for version in range(3):
        if version > 0:
            step(sd, version, 2e-6)  # an optimiser step: few served values move
            result = publisher.publish(sd)
            assert result.version == version and not result.keyframe
            assert 0 < result.density < 1
            # The delta, and from version 2 on a skip delta from version 0 as well.
            assert result.delta_bytes <= result.bytes_written < result.served_bytes // 2
        served = pull(weft_bin, tmp_path / "store", "run", version, tmp_path / f"v{version}")
        assert set(served) == set(sd)
        for name, tensor in sd.items():
            dtype, shape, raw = served[name]
            assert dtype == ("BF16" if serving == "bf16" else "F16")
            assert shape == list(tensor.shape)
            assert_served(raw, tensor.detach(), cast, name)
    assert publisher.version == 2


@pytest.mark.parametrize("fmt,block", [("e4m3", 16), ("e5m2", 0), ("e4m3", 0)])
def test_fp8_versions_match_the_reference(weft_bin, tmp_path, fmt, block):
    g = torch.Generator().manual_seed(3)
    sd = {"w": torch.randn(40, 56, generator=g) * 0.05}
    publisher = weft.Publisher(tmp_path / "store", "run", serving=f"fp8-{fmt}", block=block)
    publisher.start(sd)
    step(sd, 9, 1e-3)
    publisher.publish(sd)
    served = pull(weft_bin, tmp_path / "store", "run", 1, tmp_path / "v1")
    codes, scales = fp8_reference(sd["w"], fmt, block)
    dtype, shape, raw = served["w"]
    assert dtype == ("F8_E4M3" if fmt == "e4m3" else "F8_E5M2") and shape == [40, 56]
    assert np.frombuffer(raw, dtype=np.uint8).reshape(40, 56).tolist() == codes.tolist()
    _, scale_shape, scale_raw = served["w_scale_inv"]
    assert scale_shape == list(scales.shape)
    assert scale_raw == scales.astype(np.float32).tobytes()


def test_master_weights_are_read_in_place():
    sd = {"f32": torch.randn(300, 7), "bf16": torch.randn(10, 10).to(torch.bfloat16),
          "param": torch.nn.Parameter(torch.randn(5))}
    seen = {name: (dtype, address, shape) for name, dtype, address, shape in inspect_tensors(sd)}
    for name, tensor in sd.items():
        assert seen[name][1] == tensor.data_ptr(), name
        assert seen[name][2] == list(tensor.shape)
    assert seen["bf16"][0] == "bfloat16" and seen["f32"][0] == "float32"
    # A view at an offset is read at its offset, not copied.
    rows = sd["f32"][100:200]
    assert inspect_tensors({"rows": rows})[0][2] == rows.data_ptr()


def test_publishing_does_not_copy_the_master_weights(tmp_path):
    # In a fresh process: the peak memory while publishing, measured from the resident size just
    # before, stays below the size of the FP32 master. What a publish allocates is the new served
    # state (BF16: half the master) and the delta; a copy of the master would add all of it on top.
    script = textwrap.dedent(f"""
        import torch, weft
        def status(key):
            for line in open("/proc/self/status"):
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        master = {{"w": torch.randn(8192, 4096)}}
        publisher = weft.Publisher({str(tmp_path / 'store')!r}, "run", threads=2)
        publisher.start(master)
        master["w"].add_(torch.randn(8192, 4096) * 1e-3)
        open("/proc/self/clear_refs", "w").write("5")  # the peak becomes the current size
        before = status("VmRSS:")
        publisher.publish(master)
        print(status("VmHWM:") - before, master["w"].numel() * 4)
    """)
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                         text=True, env=dict(os.environ)).stdout.split()
    growth, master_bytes = int(out[0]), int(out[1])
    assert growth < master_bytes, (growth, master_bytes)


def test_the_gil_is_released_while_publishing(tmp_path):
    sd = {"w": torch.randn(8192, 4096)}
    publisher = weft.Publisher(tmp_path / "store", "run")
    publisher.start(sd)
    step(sd, 1, 1e-2)
    ticks = []
    done = threading.Event()

    def count():
        n = 0
        while not done.is_set():
            n += 1
            if n % 1000 == 0:
                ticks.append(time.monotonic())

    thread = threading.Thread(target=count)
    thread.start()
    while not ticks:
        time.sleep(0.001)
    started = time.monotonic()
    publisher.publish(sd)
    ended = time.monotonic()
    done.set()
    thread.join()
    # Ticks from the middle of the call: a call holding the GIL would let the counting thread run
    # only at its edges (and the interpreter's switch interval would not interrupt it).
    middle = (started + 0.25 * (ended - started), ended - 0.25 * (ended - started))
    inside = [t for t in ticks if middle[0] <= t <= middle[1]]
    assert ended - started > 0.05, ended - started
    assert len(inside) >= 5, (len(inside), ended - started)


def test_calls_from_several_threads_take_turns_without_deadlock(orchestrator, tmp_path):
    sd = {"w": torch.randn(4096, 1024)}
    publisher = weft.Publisher(tmp_path / "store", "run")
    publisher.start(sd)
    errors = []

    def publish():
        try:
            for i in range(3):
                step(sd, 10 + i, 1e-2)
                publisher.publish(sd)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    thread = threading.Thread(target=publish)
    thread.start()
    versions = set()
    while thread.is_alive():
        versions.add(publisher.version)  # answers while a publish runs
        repr(publisher)
    thread.join(30)
    assert not errors and publisher.version == 3 and versions <= {0, 1, 2, 3}
    # The batch client's statistics while a long poll waits in another thread.
    batches = weft.BatchClient(orchestrator.url, orchestrator.TOKENS["trainer"], max_staleness=1,
                               deadline=10)
    poll = threading.Thread(target=lambda: batches.next_batch(1, 0, timeout=1.0))
    poll.start()
    while poll.is_alive():
        assert batches.staleness["groups"] == 0
        time.sleep(0.01)
    poll.join(10)
    assert not poll.is_alive()


def test_sharded_publishing_from_two_processes(weft_bin, tmp_path):
    script = textwrap.dedent("""
        import sys, torch, weft
        rank, store = int(sys.argv[1]), sys.argv[2]
        g = torch.Generator().manual_seed(rank)
        sd = {f"rank{rank}.w": torch.randn(64, 32, generator=g),
              f"rank{rank}.b": torch.randn(32, generator=g)}
        publisher = weft.Publisher(store, "sharded", rank=rank, world=2, shard_deadline=60)
        print(publisher.start(sd).version, flush=True)
        for v in range(1, 3):
            sd[f"rank{rank}.w"].add_(torch.randn(64, 32, generator=g) * 1e-2)
            print(publisher.publish(sd).version, flush=True)
        torch.save(sd, f"{store}.rank{rank}.pt")
    """)
    store = tmp_path / "store"
    ranks = [subprocess.Popen([sys.executable, "-c", script, str(r), str(store)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    for r, p in enumerate(ranks):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert out.split() == ["0", "1", "2"], (r, out)
    served = pull(weft_bin, store, "sharded", 2, tmp_path / "v2")
    for r in (0, 1):
        for name, tensor in torch.load(f"{store}.rank{r}.pt").items():
            assert served[name][2] == bits(tensor.to(torch.bfloat16)), name


# --- the orchestrator ------------------------------------------------------------------------

def run_worker(o, versions_by_job, ready: int = 0):
    """Registers a cluster, leases every queued job and submits two samples per job, generated at
    the versions given by `versions_by_job(job)`: [(version, first token), ...]."""
    token = o.call("POST", "/v1/clusters", {"cluster": "c1", "region": "r", "capacity": 8},
                   o.TOKENS["worker"])["cluster_token"]
    o.call("POST", "/v1/clusters/c1/heartbeat", {"ready_version": ready}, token)
    leases = o.call("POST", "/v1/clusters/c1/leases", {"max": 8, "wait_ms": 2000}, token)["leases"]
    for lease in leases:
        segments = versions_by_job(lease["job"])
        samples = [{"tokens": [1, 2, 3], "logprobs": [-0.5, -0.25, -1.0], "reward": 1.0},
                   {"tokens": [4, 5], "logprobs": [-2.0, -0.125], "reward": 0.0}]
        o.call("POST", "/v1/clusters/c1/submissions", {
            "job": lease["job"], "attempt": lease["attempt"], "cluster": "c1",
            "version_start": min(v for v, _ in segments),
            "version_end": max(v for v, _ in segments), "segments": segments, "tokens": 5,
            # A lease carries its prompt as JSON text.
            "trajectories": {"prompt": json.loads(lease["prompt"]), "samples": samples}}, token)
    return leases


def test_jobs_and_batches_against_a_real_orchestrator(orchestrator):
    o = orchestrator
    client = weft.Orchestrator(o.url, o.TOKENS["trainer"], deadline=10)
    client.announce(0)
    ids = client.add_jobs(["1+1=", {"prompt": [3, 4], "samples": 2, "metadata": {"answer": 7}}],
                          samples=2, metadata={"row": 1})
    assert len(ids) == 2 and ids[0] < ids[1]
    status = client.status()
    assert status["jobs"]["queued"] == 2 and status["latest_version"] == 0
    client.announce(1)
    # Job 1's tokens came from version 0 then 1 (an update landed after the third token).
    leases = run_worker(o, lambda job: [[0, 0], [1, 3]] if job == ids[0] else [[1, 0]], ready=1)
    assert len(leases) == 2
    batches = weft.BatchClient(o.url, o.TOKENS["trainer"], deadline=10)
    groups = batches.next_batch(2, trainer_version=1, timeout=5)
    assert sorted(g.job for g in groups) == ids
    by_job = {g.job: g for g in groups}
    mixed, fresh = by_job[ids[0]], by_job[ids[1]]
    assert mixed.prompt == "1+1=" and mixed.metadata == {"row": 1}
    assert fresh.prompt == [3, 4] and fresh.metadata == {"answer": 7}
    assert (mixed.version_start, mixed.version_end, mixed.lag) == (0, 1, 1)
    assert [s.versions for s in mixed.samples] == [[0, 0, 0], [1, 1]]
    assert [s.versions for s in fresh.samples] == [[1, 1, 1], [1, 1]]
    assert mixed.samples[0].logprobs == [-0.5, -0.25, -1.0] and mixed.samples[1].reward == 0.0
    assert not mixed.stale
    t = weft.batch_tensors(groups, pad=15)
    assert t.tokens.shape == (4, 3) and t.tokens[1].tolist() == [4, 5, 15]
    assert t.mask.tolist()[1] == [True, True, False]
    assert t.versions.tolist() == [s.versions + [-1] * (3 - len(s.versions))
                                   for g in groups for s in g.samples]
    assert t.group.tolist() == [0, 0, 1, 1] and t.lengths.tolist() == [3, 2, 3, 2]
    assert t.logprobs[1, 1].item() == -0.125 and t.rewards.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert t.prompt_lengths.tolist() == [0, 0, 0, 0]
    # With the prompts in front (the model's input): the loss mask and logprobs follow the tokens.
    encode = {"1+1=": [13, 1, 10, 1, 11], json.dumps([3, 4]): [3, 4]}
    p = weft.batch_tensors(groups, pad=15, prompt_tokens=lambda g: encode[
        g.prompt if isinstance(g.prompt, str) else json.dumps(g.prompt)])
    first = [13, 1, 10, 1, 11] if groups[0].prompt == "1+1=" else [3, 4]
    assert p.tokens[0].tolist()[:len(first) + 3] == first + groups[0].samples[0].tokens
    assert p.prompt_lengths.tolist()[0] == len(first)
    assert p.mask[0].tolist()[:len(first) + 3] == [False] * len(first) + [True] * 3
    assert p.logprobs[0, len(first)].item() == groups[0].samples[0].logprobs[0]
    assert p.versions[0, len(first) - 1].item() == -1
    assert p.lengths.tolist()[0] == len(first) + 3 and p.tokens.shape[1] == 5 + 3
    stats = batches.staleness
    assert stats["groups"] == 2 and stats["samples"] == 4 and stats["violations"] == 0
    assert stats["lag_histogram"] == {0: 1, 1: 1} and stats["max_lag"] == 1
    # Nothing more: an empty batch after the timeout, not an error.
    assert batches.next_batch(1, trainer_version=1, timeout=0.2) == []
    batches.acknowledge()


def test_malformed_groups_are_set_aside_with_the_reason(orchestrator, caplog):
    o = orchestrator
    client = weft.Orchestrator(o.url, o.TOKENS["trainer"], deadline=10)
    client.announce(0)
    bad_job, good_job = client.add_jobs(["2+2=", "3+3="])
    token = o.call("POST", "/v1/clusters", {"cluster": "c1", "region": "r", "capacity": 2},
                   o.TOKENS["worker"])["cluster_token"]
    o.call("POST", "/v1/clusters/c1/heartbeat", {"ready_version": 0}, token)
    leases = o.call("POST", "/v1/clusters/c1/leases", {"max": 2, "wait_ms": 2000},
                    token)["leases"]
    assert sorted(lease["job"] for lease in leases) == [bad_job, good_job]
    for lease in leases:
        logprobs = [-1.0] if lease["job"] == bad_job else [-1.0, -0.5]
        o.call("POST", "/v1/clusters/c1/submissions", {
            "job": lease["job"], "attempt": lease["attempt"], "cluster": "c1",
            "version_start": 0, "version_end": 0, "segments": [[0, 0]], "tokens": 2,
            "trajectories": {"prompt": json.loads(lease["prompt"]),
                             "samples": [{"tokens": [1, 2], "logprobs": logprobs,
                                          "reward": 1}]}}, token)
    batches = weft.BatchClient(o.url, o.TOKENS["trainer"], max_staleness=1, deadline=10)
    groups = []
    deadline = time.monotonic() + 10
    while len(groups) + len(batches.rejected) < 2 and time.monotonic() < deadline:
        groups += batches.next_batch(2, trainer_version=0, timeout=2)
    # The good group of the batch is returned; the bad one is set aside with its reason.
    assert [g.job for g in groups] == [good_job]
    assert batches.rejected == [(bad_job, f"job {bad_job} sample 0: 2 tokens need as many "
                                          "numeric logprobs")]
    assert batches.staleness["rejected"] == 1
    assert "skipping a malformed trajectory group" in caplog.text


# --- errors ----------------------------------------------------------------------------------

def test_errors_are_exceptions_with_weft_messages(orchestrator, tmp_path):
    with pytest.raises(weft.InvalidArgument, match="unknown scheme 'gs'"):
        weft.Publisher("gs://bucket/x", "run")
    with pytest.raises(ValueError, match="serving format 'int4'"):
        weft.Publisher(tmp_path, "run", serving="int4")
    with pytest.raises(weft.InvalidArgument, match="run id"):
        weft.Publisher(tmp_path, "bad run id!")
    with pytest.raises(ValueError, match="delta_mode must be 'plain' or 'context'"):
        weft.Publisher(tmp_path, "run", delta_mode="zstd")
    # Mistyped store URIs are refused, and create nothing.
    cwd = os.getcwd()
    os.chdir(tmp_path)
    present = sorted(os.listdir(tmp_path))
    try:
        for typo in ("s3:/b/x", "s3:bucket", "s3//bucket", "http:/127.0.0.1:1", "file:relative",
                     "/tmp/a\x00b"):
            with pytest.raises(weft.InvalidArgument, match="s3://BUCKET/PREFIX"):
                weft.Publisher(typo, "run")
        for wrong in (None, 3, b"/tmp/x"):
            with pytest.raises(weft.InvalidArgument, match="store must be a directory path"):
                weft.Publisher(wrong, "run")
        assert sorted(os.listdir(tmp_path)) == present
    finally:
        os.chdir(cwd)
    publisher = weft.Publisher(tmp_path / "store", "run")
    with pytest.raises(weft.Conflict, match="before start"):
        publisher.publish({"w": torch.zeros(3)})
    with pytest.raises(weft.InvalidArgument, match="'w' is float64"):
        publisher.start({"w": torch.zeros(3, dtype=torch.float64)})
    with pytest.raises(weft.InvalidArgument, match="'w' is not contiguous"):
        publisher.start({"w": torch.zeros(3, 4).t()})
    with pytest.raises(weft.InvalidArgument, match="'w' is not contiguous"):
        publisher.start({"w": np.zeros((3, 4), dtype=np.float32).T})  # DLPack strides checked
    with pytest.raises(weft.InvalidArgument, match="'w' is not aligned"):
        publisher.start({"w": np.frombuffer(bytearray(41), dtype=np.float32, offset=1)})
    with pytest.raises(weft.InvalidArgument, match="complex64|type code"):
        publisher.start({"w": np.zeros(3, dtype=np.complex64)})
    with pytest.raises(weft.InvalidArgument, match="'w' is a list"):
        publisher.start({"w": [1.0, 2.0]})
    publisher.start({"w": torch.zeros(3, 4)})
    with pytest.raises(weft.InvalidArgument, match="not served"):
        publisher.publish({"x": torch.zeros(3, 4)})
    assert publisher.publish({"w": torch.ones(3, 4)}).version == 1  # it goes on after an error
    # A second publisher of the same run is refused.
    with pytest.raises(weft.Conflict, match="already exists"):
        weft.Publisher(tmp_path / "store", "run").start({"w": torch.zeros(3, 4)})
    # The orchestrator refuses versions that go backwards, and bad jobs, with its message.
    client = weft.Orchestrator(orchestrator.url, orchestrator.TOKENS["trainer"], deadline=5)
    client.announce(3)
    with pytest.raises(weft.InvalidArgument, match="version 2 is older than the announced 3"):
        client.announce(2)
    with pytest.raises(weft.InvalidArgument, match="samples must be an integer"):
        client.add_jobs(["1+1="], samples=0)
    with pytest.raises(weft.InvalidArgument, match=r"prompts\[0\]'s prompt is not JSON"):
        client.add_jobs([float("nan")])
    with pytest.raises(weft.Error, match="token"):
        weft.Orchestrator(orchestrator.url, "wrong", deadline=5).announce(4)
    # An orchestrator that is not there: unavailable (or timed out) after the deadline.
    gone = weft.Orchestrator("http://127.0.0.1:9", "t", deadline=1)
    started = time.monotonic()
    with pytest.raises((weft.Unavailable, weft.Timeout)):
        gone.status()
    assert time.monotonic() - started < 10
