"""A reward service for the end-to-end tests (docs/api.md, "Reward service"): POST {"prompt",
"metadata", "completion": {"text", "tokens"}} answers {"reward": 1.0} when the completion's text is
the metadata's "answer", else {"reward": 0.0}; a request without an answer in its metadata is
refused with 400. Every request is appended to the log as one JSON line, with the reward answered.

Usage: reward_service.py --port PORT --log FILE    (/usr/bin/python3; runs until SIGTERM)
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    log_file = None
    lock = threading.Lock()

    def answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        self.answer(200, {"ok": True})  # liveness, for the test to wait on

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length", "0"))
        try:
            request = json.loads(self.rfile.read(length))
            answer = request["metadata"]["answer"]
            text = request["completion"]["text"]
        except (ValueError, KeyError, TypeError) as error:
            self.answer(400, {"error": f"not a scoring request with metadata.answer: {error!r}"})
            return
        reward = 1.0 if text == answer else 0.0
        with self.lock:
            self.log_file.write(json.dumps({"path": self.path, "request": request,
                                            "reward": reward}) + "\n")
            self.log_file.flush()
        self.answer(200, {"reward": reward})

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
        pass  # the JSON log is the record


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    Handler.log_file = open(args.log, "a", encoding="utf-8")
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"reward service on 127.0.0.1:{args.port}", flush=True)
    server.serve_forever()
    Handler.log_file.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
