"""Fixtures of the weft package's tests: the weft binary, a scratch directory, a live orchestrator.

Run them with the package built (./setup.sh): PYTHONPATH=build/python /usr/bin/python3 -m pytest
tests/python (ctest does this, with WEFT_BIN set to the weft binary it built).
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def weft_bin() -> str:
    path = os.environ.get("WEFT_BIN", str(ROOT / "build" / "cli" / "weft"))
    if not os.access(path, os.X_OK):
        pytest.fail(f"no weft binary at {path}: build it (./setup.sh) or set WEFT_BIN")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningOrchestrator:
    """`weft orchestrator` on a free port, with tokens worker/trainer/admin."""

    TOKENS = {"worker": "w-token", "trainer": "t-token", "admin": "a-token"}

    def __init__(self, weft_bin: str, directory: pathlib.Path, max_staleness: int = 1):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = directory / "orchestrator.yaml"
        config.write_text(
            "orchestrator:\n"
            f"  listen: 127.0.0.1:{self.port}\n"
            f"  journal: {directory / 'journal'}\n"
            f"  max_staleness: {max_staleness}\n"
            "  stale_policy: deliver_flagged\n"
            "  max_wait: 5s\n"
            f"  tokens: {json.dumps(self.TOKENS)}\n")
        self.log = open(directory / "orchestrator.log", "wb")
        self.process = subprocess.Popen([weft_bin, "orchestrator", "--config", str(config)],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the orchestrator did not start (see {directory})")
            time.sleep(0.05)

    def call(self, method: str, path: str, body, token: str):
        """One request as a worker would send it; returns the answer's JSON."""
        request = urllib.request.Request(
            self.url + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        self.log.close()


@pytest.fixture
def orchestrator(weft_bin, tmp_path):
    running = RunningOrchestrator(weft_bin, tmp_path)
    yield running
    running.stop()
