"""Where the pre-flight's nodes meet: a TCP listener on the master's port and one connection per node, carrying
JSON lines. Plain sockets with a deadline on every wait, so that a node that never comes or a blocked port ends a
wait with None (a finding), never a hang; and no torch, whose TCPStore would need it on the host."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

CONNECT_RETRY_S = 0.5
PORT_PROBE_S = 3.0  # a SYN that gets no answer within this is a dropped (firewalled) port


class Channel:
    """One node's connection to the master: send and receive JSON objects, one per line."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = b""

    def send(self, message: dict[str, Any]) -> bool:
        try:
            self.sock.sendall(json.dumps(message).encode() + b"\n")
            return True
        except OSError:
            return False

    def receive(self, deadline: float) -> dict[str, Any] | None:
        """The next message, or None when the peer closed or said nothing before `deadline` (time.monotonic)."""
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                return None
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return None

    def close(self) -> None:
        self.sock.close()


def listen(port: int, host: str = "") -> socket.socket:
    """A listening socket on every address (OSError, e.g. 'address already in use', is the caller's finding)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def accept(listener: socket.socket, deadline: float) -> Channel | None:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return None
    listener.settimeout(remaining)
    try:
        conn, _ = listener.accept()
    except OSError:
        return None
    return Channel(conn)


def connect(host: str, port: int, deadline: float) -> tuple[Channel | None, str]:
    """Connect, retrying until `deadline` (the master may start later than this node). (channel, '') or
    (None, the last error)."""
    error = "no attempt"
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, min(PORT_PROBE_S, deadline - time.monotonic())))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return Channel(sock), ""
        except socket.timeout:
            error = "timed out (a firewall drops the packets?)"
        except OSError as exc:
            error = (exc.strerror or str(exc)).lower()
        time.sleep(CONNECT_RETRY_S)
    return None, error


def probe_ports(host: str, ports: list[int]) -> dict[str, str]:
    """Each port of `host`: 'ok', or why a TCP connection failed. Side by side, each within PORT_PROBE_S."""
    results: dict[str, str] = {}

    def one(port: int) -> None:
        try:
            socket.create_connection((host, port), timeout=PORT_PROBE_S).close()
            results[str(port)] = "ok"
        except socket.timeout:
            results[str(port)] = "timed out"
        except OSError as exc:
            results[str(port)] = (exc.strerror or str(exc)).lower()

    threads = [threading.Thread(target=one, args=(port,), daemon=True) for port in ports]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PORT_PROBE_S + 1)
    return {str(port): results.get(str(port), "timed out") for port in ports}
