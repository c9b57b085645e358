"""Proves that model.py computes what the rollout workers' C++ engine computes.

It trains a TinyLm briefly (so that its distributions are far from uniform), writes its weights
in BF16 as a safetensors file, publishes them as version 0 with ``weft store publish``, starts an
orchestrator and one ``weft worker`` (the embedded engine, sampling at temperature 1), and plays
the trainer over the orchestrator's HTTP API: it announces version 0, queues problems and takes
the trajectory groups. Then it scores every generated token with the PyTorch model and compares
with the behaviour logprob the worker recorded:

- on the served weights (the BF16 values widened to FP32, which is what the engine computes
  with), the two must agree to float rounding (``--tolerance``, default 1e-4);
- on the FP32 master weights (what the trainer computes with), the difference is the one BF16
  serving makes: this is the importance ratio of a lag-0 token in training.

Needs the built ``weft`` binary (``--weft``, default build/cli/weft), not the weft Python
package. Exit status 0 when they agree. Run from the repository root::

    /usr/bin/python3 examples/torch_trainer/engine_agreement.py
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

import torch

from grpo import Optimizer, OptimizerConfig, supervised_step
from model import TinyLm, TinyLmConfig
from task import ArithmeticTask

TOKENS = {"worker": "check-worker", "trainer": "check-trainer", "admin": "check-admin"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_bf16_safetensors(path: str, tensors: dict[str, torch.Tensor]) -> None:
    """The tensors rounded to BF16 (round to nearest even), in the safetensors format."""
    header: dict[str, Any] = {}
    blobs = []
    offset = 0
    for name, tensor in tensors.items():
        data = tensor.detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def call(url: str, body: Any | None = None, deadline: float = 30.0) -> Any:
    """A JSON request with the trainer token, retried while the server is not up yet."""
    request = urllib.request.Request(
        url, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKENS['trainer']}",
                 "Content-Type": "application/json"})
    give_up = time.monotonic() + deadline
    while True:
        try:
            with urllib.request.urlopen(request, timeout=deadline) as answer:
                return json.load(answer)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{url}: {e.code} {e.read().decode(errors='replace')}") from e
        except (urllib.error.URLError, ConnectionError) as e:
            if time.monotonic() > give_up:
                raise RuntimeError(f"{url}: {e}") from e
            time.sleep(0.1)


def start(command: list[str], log_path: str) -> subprocess.Popen:
    log = open(log_path, "w")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weft", default="build/cli/weft", help="the weft binary")
    parser.add_argument("--warmup-steps", type=int, default=150)
    parser.add_argument("--problems", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="largest |logprob difference| allowed on the served weights")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    if not os.access(args.weft, os.X_OK):
        print(f"no weft binary at {args.weft} (build it, or give --weft)", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    task = ArithmeticTask(2)
    config = TinyLmConfig(max_seq=task.max_length())
    model = TinyLm(config, torch.Generator().manual_seed(7))
    rng = random.Random(7)
    optimizer = Optimizer(model, OptimizerConfig(learning_rate=3e-3))
    for _ in range(args.warmup_steps):
        loss = supervised_step(model, optimizer, task, rng, 64)
    print(f"warm-up: {args.warmup_steps} steps, loss {loss:.3f}")
    served = TinyLm(config)
    served.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()})

    work = tempfile.mkdtemp(prefix="weft-engine-agreement-")
    children: list[subprocess.Popen] = []
    try:
        write_bf16_safetensors(f"{work}/model.safetensors", model.state_dict())
        subprocess.run([args.weft, "store", "publish", "--store", f"{work}/store", "--run", "check",
                        "--threads", "1", f"{work}/model.safetensors"], check=True)
        port = free_port()
        orchestrator = f"http://127.0.0.1:{port}"
        tokens = "{" + ", ".join(f"{k}: {v}" for k, v in TOKENS.items()) + "}"
        with open(f"{work}/orchestrator.yaml", "w") as f:
            f.write(f"orchestrator:\n  listen: 127.0.0.1:{port}\n  journal: {work}/journal\n"
                    f"  run: check\n  threads: 2\n  tokens: {tokens}\n")
        with open(f"{work}/run.yaml", "w") as f:
            f.write(f"run: {{id: check, dir: {work}/run}}\n"
                    f"orchestrator: {{listen: 127.0.0.1:{port}, tokens: {tokens}}}\n"
                    f"regions:\n  - {{name: local, relay: 127.0.0.1:{free_port()}, workers: 1}}\n"
                    "worker: {capacity: 4, threads: 1, temperature: 1.0, top_p: 1.0, "
                    "heartbeat: 200ms}\n"
                    f"model: {{d_model: {config.d_model}, layers: {config.layers}, "
                    f"heads: {config.heads}, d_ff: {config.d_ff}}}\n"
                    f"task: {{kind: arithmetic, digits: {task.digits}}}\n")
        children.append(start([args.weft, "orchestrator", "--config", f"{work}/orchestrator.yaml"],
                              f"{work}/orchestrator.log"))
        call(f"{orchestrator}/v1/versions", {"version": 0})
        children.append(start([args.weft, "worker", "--config", f"{work}/run.yaml", "--cluster",
                               "check-1", "--region", "local", "--orchestrator", orchestrator,
                               "--store", f"{work}/store"], f"{work}/worker.log"))
        problems = [task.problem(rng) for _ in range(args.problems)]
        call(f"{orchestrator}/v1/jobs",
             {"prompts": [{"prompt": p, "samples": args.samples} for p in problems]})
        groups: list[dict] = []
        ack = None
        give_up = time.monotonic() + 60
        while len(groups) < len(problems):
            if time.monotonic() > give_up:
                raise RuntimeError(f"only {len(groups)} of {len(problems)} groups came in 60 s "
                                   f"(see {work}/worker.log)")
            batch = call(f"{orchestrator}/v1/batches", {"max": 64, "wait_ms": 1000, "ack": ack})
            if batch["batch"]:
                ack = batch["batch"]
                groups += batch["trajectories"]
        call(f"{orchestrator}/v1/batches", {"max": 0, "ack": ack})
    finally:
        # The worker first: it drains, handing its leases back to the orchestrator.
        for child in reversed(children):
            child.terminate()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if args.keep:
            print(f"work directory: {work}")
        else:
            subprocess.run(["rm", "-rf", work], check=True)

    served_worst = master_worst = 0.0
    master_sum = behaviour_sum = 0.0
    tokens = 0
    with torch.no_grad():
        for g in groups:
            t = g["trajectories"]
            t = json.loads(t) if isinstance(t, str) else t
            prompt = task.encode(t["prompt"])
            for s in t["samples"]:
                sequence = torch.tensor([prompt + s["tokens"]])
                worker = torch.tensor(s["logprobs"])
                first = len(prompt) - 1
                on_served = served.logprobs(sequence)[0, first:]
                on_master = model.logprobs(sequence)[0, first:]
                served_worst = max(served_worst, float((on_served - worker).abs().max()))
                master_worst = max(master_worst, float((on_master - worker).abs().max()))
                master_sum += float((on_master - worker).abs().sum())
                behaviour_sum += float(worker.sum())
                tokens += len(s["tokens"])
    print(f"{len(groups)} groups, {tokens} generated tokens, mean behaviour logprob "
          f"{behaviour_sum / tokens:.3f} (uniform: {-math.log(config.vocab):.3f})")
    print(f"served (BF16) weights: largest |logprob difference| {served_worst:.2e}")
    print(f"master (FP32) weights: largest |log ratio| {master_worst:.2e}, mean "
          f"{master_sum / tokens:.2e}")
    if served_worst > args.tolerance:
        print(f"DISAGREE: the engine's logprobs differ by more than {args.tolerance}",
              file=sys.stderr)
        return 1
    print("the PyTorch model and the C++ engine agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
