"""``Orchestrator.status()`` held to the golden status bodies the C++ wire suite is held to
(tests/data/status.json): served by a stand-in orchestrator, the good body comes back as it was
sent, and each broken one is refused with the decoder's message."""

from __future__ import annotations

import copy
import http.server
import json
import pathlib
import threading
from typing import Any, Iterator, List

import pytest

import weft

GOLDEN = json.loads((pathlib.Path(__file__).resolve().parents[1] / "data" /
                     "status.json").read_text())


def _pointer(path: str) -> List[str]:
    """An RFC 6901 pointer's reference tokens."""
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def _patched(body: Any, patch: List[dict]) -> Any:
    """``body`` after the RFC 6902 operations ``patch`` (add, remove and replace suffice here):
    as nlohmann's patch() applies them, so that both suites see the same bodies."""
    body = copy.deepcopy(body)
    for op in patch:
        *parents, last = _pointer(op["path"])
        node = body
        for token in parents:
            node = node[int(token)] if isinstance(node, list) else node[token]
        kind = op["op"]
        if isinstance(node, list):
            key: Any = len(node) if last == "-" and kind == "add" else int(last)
            present = 0 <= key < len(node)
        else:
            key, present = last, last in node
        if kind == "add" and isinstance(node, list):
            node.insert(key, op["value"])
        elif kind == "add" or (kind == "replace" and present):
            node[key] = op["value"]
        elif kind == "remove" and present:
            del node[key]
        else:
            raise ValueError(f"cannot {kind} {op['path']}")
    return body


class _StatusServer(http.server.ThreadingHTTPServer):
    """Answers every GET /v1/status with ``text``."""

    text = ""


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        data = self.server.text.encode() if self.path == "/v1/status" else b"{}"
        self.send_response(200 if self.path == "/v1/status" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[_StatusServer]:
    running = _StatusServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    yield running
    running.shutdown()
    running.server_close()


def _client(server: _StatusServer) -> weft.Orchestrator:
    return weft.Orchestrator(f"http://127.0.0.1:{server.server_address[1]}", "t", deadline=5)


def test_the_golden_status_comes_back_as_sent(server: _StatusServer) -> None:
    server.text = json.dumps(GOLDEN["body"])
    assert _client(server).status() == GOLDEN["body"]


@pytest.mark.parametrize("case", GOLDEN["bad"], ids=[c["name"] for c in GOLDEN["bad"]])
def test_a_broken_status_is_refused_naming_the_field(server: _StatusServer, case: dict) -> None:
    server.text = case["text"] if "text" in case else json.dumps(
        _patched(GOLDEN["body"], case["patch"]))
    with pytest.raises(weft.DataLoss) as caught:
        _client(server).status()
    expected = "GET /v1/status: " + case["error"]
    if case.get("prefix"):
        assert str(caught.value).startswith(expected), str(caught.value)
    else:
        assert str(caught.value) == expected
