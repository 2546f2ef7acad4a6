"""A local OTLP/HTTP receiver that accepts traces and discards them.

    python -m benchmarks.otlp_sink --port-file FILE

The benchmark's tracing case exports spans the way a deployment does (pgworker's own
``OTEL_TRACES_EXPORTER=otlp`` set-up: an SDK provider, a batch span processor, the
OTLP/HTTP protobuf exporter) to this sink instead of a collector: it answers
``POST /v1/traces`` with an empty ``ExportTraceServiceResponse`` after decoding the
request only to count its spans (so the benchmark can tell whether every job was
traced, or the batch processor dropped spans), and ``GET /stats`` with
``{"requests", "bytes", "spans"}`` as JSON. It runs in its own process, whose CPU the
harness reports apart (on a real deployment the collector runs elsewhere).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

COUNTS = {"requests": 0, "bytes": 0, "spans": 0, "errors": 0}
LOCK = threading.Lock()


def _spans(body: bytes) -> int:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    return sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        try:
            n, bad = _spans(body), 0
        except Exception:
            n, bad = 0, 1
        with LOCK:
            COUNTS["requests"] += 1
            COUNTS["bytes"] += len(body)
            COUNTS["spans"] += n
            COUNTS["errors"] += bad
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        with LOCK:
            data = json.dumps(COUNTS).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Sink:
    """The sink as a subprocess: ``with Sink() as sink:`` then ``sink.endpoint``,
    ``sink.stats()``, ``sink.cpu_seconds()``."""

    def __enter__(self) -> "Sink":
        import tempfile

        self.port_file = tempfile.mktemp(prefix="pgworker-bench-otlp-")
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.otlp_sink", "--port-file", self.port_file],
                                     cwd=here, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.port_file) or not open(self.port_file).read().strip():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the OTLP sink did not start: {self.proc.stderr.read()[-2000:]}")
            time.sleep(0.02)
        self.port = int(open(self.port_file).read())
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, int]:
        import urllib.request

        with urllib.request.urlopen(f"{self.endpoint}/stats", timeout=10) as resp:
            return json.loads(resp.read())

    def cpu_seconds(self) -> float:
        from .common import cpu_seconds

        return cpu_seconds(self.proc.pid)

    def __exit__(self, *exc: Any) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            os.unlink(self.port_file)
        except OSError:
            pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", required=True)
    a = p.parse_args()
    _spans(b"")  # import the protobuf classes before the first request
    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(tmp, a.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
