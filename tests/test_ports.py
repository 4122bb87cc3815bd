"""Ports autospec picks for its own servers, and the soak's readiness check (no Ray here)."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from autospec.bench.soak.procs import healthy
from autospec.ports import HIGH, LOW, free_port, in_use


def test_free_ports_lie_outside_rays_worker_ports_and_the_ephemeral_range():
    low_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(50)}
    assert all(LOW <= p <= HIGH < low_ephemeral for p in ports)
    assert all(p >= 20000 for p in ports)  # Ray's workers: 10002-19999
    assert len(ports) > 1


def test_a_listening_port_is_in_use_and_a_closed_one_is_not():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert in_use("127.0.0.1", port)
    assert not in_use("127.0.0.1", port)


class _Answers(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def _serving(body: bytes) -> tuple[ThreadingHTTPServer, str]:
    handler = type("H", (_Answers,), {"body": body})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_a_200_that_is_not_autospecs_health_is_not_ready():
    """What a soak once took for its server: Ray's metrics exporter on the same port."""
    for body, ready in ((b"# HELP autoscaler_pending_resources x\n", False),
                        (b"[1, 2]", False), (b'{"ok": false}', False), (b'{"ok": true}', True)):
        server, url = _serving(body)
        try:
            assert healthy(url) is ready, body
        finally:
            server.shutdown()
            server.server_close()
