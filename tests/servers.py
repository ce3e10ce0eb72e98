"""Local servers for tests, all on 127.0.0.1: an ASGI app under uvicorn in a thread, and a scripted
http.server whose replies a test decides (`FakeServer`; the `serve` fixture in conftest.py)."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import uvicorn


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dead_url() -> str:
    """A 127.0.0.1 URL on which nothing listens (connections are refused at once)."""
    return f"http://127.0.0.1:{free_port()}"


@contextmanager
def serve_in_thread(app, port: int | None = None) -> Iterator[str]:
    """Yield the base URL of `app` served by uvicorn; stop it on exit."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("test server did not start within 10 s")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


DROP = object()  # a reply that closes the connection without answering


class FakeServer:
    """A threaded http.server on a free port; `reply(seen)` returns (status, body, headers)."""

    def __init__(self, reply: Callable[[Seen], Any]) -> None:
        self.reply = reply
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                split = urlsplit(self.path)
                headers = {k.lower(): v for k, v in self.headers.items()}
                seen = Seen(self.command, split.path, parse_qs(split.query), headers, body)
                with outer.lock:
                    outer.seen.append(seen)
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                try:
                    answer = outer.reply(seen)
                finally:
                    with outer.lock:
                        outer.in_flight -= 1
                if answer is DROP:
                    return
                status, payload, extra = answer
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    for key, value in extra.items():
                        self.send_header(key, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            do_GET = do_POST = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
