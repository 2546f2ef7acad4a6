"""A small TCP proxy on loopback whose traffic the test controls.

``TcpProxy(upstream_host, upstream_port)`` listens on 127.0.0.1 on a free port and
forwards every connection to the upstream. The harness can then:

- ``drop(seconds)``: reset every open connection (the peers see a connection reset, as
  when a NAT or a load balancer forgets a flow) and reset new connections at once for
  ``seconds``, so clients cannot reconnect until the path heals;
- ``pause()`` / ``resume()``: stop forwarding bytes without closing anything (a stalled
  path), then carry on;
- ``reset_all()``: the reset alone.

Only loopback addresses are used. Threads, not asyncio, so it runs beside any test.
"""

from __future__ import annotations

import socket
import struct
import threading
import time


class TcpProxy:
    def __init__(self, upstream_host: str, upstream_port: int, *, listen_host: str = "127.0.0.1") -> None:
        if not listen_host.startswith("127.") or not (upstream_host.startswith("127.") or upstream_host == "localhost"):
            raise ValueError("the test proxy only listens on and forwards to loopback addresses")
        self.upstream = (upstream_host, upstream_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((listen_host, 0))
        self.listener.listen(256)
        self.host, self.port = self.listener.getsockname()
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._refuse_until = 0.0
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self.connections = 0
        self.resets = 0
        threading.Thread(target=self._accept_loop, name="tcp-proxy-accept", daemon=True).start()

    # -- control -------------------------------------------------------------------

    def drop(self, seconds: float) -> int:
        """Reset all connections and refuse (reset) new ones for ``seconds``. Returns how many
        connections were cut."""
        with self._lock:
            self._refuse_until = time.monotonic() + seconds
        return self.reset_all()

    def reset_all(self) -> int:
        with self._lock:
            pairs = list(self._pairs)
            self._pairs.clear()
        for a, b in pairs:
            _reset(a)
            _reset(b)
        self.resets += len(pairs)
        return len(pairs)

    def pause(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        try:
            self.listener.close()
        except OSError:
            pass
        self.reset_all()

    def dsn_for(self, dsn: str) -> str:
        """``dsn`` (a postgresql:// URL) with its host and port replaced by the proxy's."""
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(dsn)
        userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        return urlunsplit(parts._replace(netloc=f"{userinfo}{self.host}:{self.port}"))

    # -- the forwarding ----------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                refuse = time.monotonic() < self._refuse_until
            if refuse:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _reset(client)
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = (client, upstream)
            with self._lock:
                self._pairs.add(pair)
            self.connections += 1
            threading.Thread(target=self._pump, args=(client, upstream, pair), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, pair), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, pair: tuple[socket.socket, socket.socket]) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        with self._lock:
            live = pair in self._pairs
            self._pairs.discard(pair)
        if live:
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                try:
                    s.close()
                except OSError:
                    pass

    def __enter__(self) -> "TcpProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reset(s: socket.socket) -> None:
    """Close with SO_LINGER 0, so the peer gets a TCP RST rather than an orderly FIN.
    ``shutdown(SHUT_RD)`` first wakes our own pump thread blocked in recv() on it (a bare
    close() from another thread would not, and the RST would wait for that thread)."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
