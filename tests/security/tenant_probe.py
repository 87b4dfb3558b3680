"""What hostile model code tries against the node's network: every socket the kernel offers, at
every port it is told.

This file is model code: a container's `code/inference.py` (test_sec_sandbox) and part of the
hostile tenant of the shared server (tests/suite/handlers.py). A request `{"sockets": {"listen":
[[host, port], ...], "connect": [...], "unix": [path, ...], "window_s": s}}` makes it create a
socket of every family (1-45), type and protocol it can; with each Internet one, bind the listen
ports (with SO_REUSEPORT, on the address, the wildcard and, for IPv6, the mapped address) and
listen, and connect to the connect ports; with a Unix one, connect to the paths. It answers what it
created, bound and connected, and keeps whatever it bound accepting and receiving for `window_s`
seconds (the test sends traffic meant for the gateway meanwhile); `{"collect": true}` then answers
how much it got.
"""

import json
import select
import socket
import threading
import time

_TYPES = (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW, socket.SOCK_SEQPACKET)
# 0, ICMP, TCP, UDP, ICMPv6, SCTP, UDP-Lite, raw, MPTCP, and ETH_P_ALL for packet sockets (network
# byte order)
_PROTOCOLS = (0, 1, 6, 17, 58, 132, 136, 255, 262, 768)
_INET = (socket.AF_INET, socket.AF_INET6)
_CONNECTED = (socket.SOCK_STREAM, socket.SOCK_SEQPACKET)
_GOT = {"received": 0, "done": False}


def _addresses(family, host):
    if family == socket.AF_INET:
        return [host, "0.0.0.0"]
    return ["::", "::ffff:" + host]


def _listen(family, kind, protocol, host, port):
    listener = socket.socket(family, kind, protocol)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.bind((host, port))
    if kind in _CONNECTED:
        listener.listen(64)
    listener.setblocking(False)
    return listener


def _connect(family, kind, protocol, address):
    client = socket.socket(family, kind, protocol)
    client.settimeout(3)
    try:
        client.connect(address)
    finally:
        client.close()


def _receive(listeners, window_s):
    """Accept and read whatever reaches what it bound; answer like a gateway would, to count as a
    theft."""
    deadline = time.monotonic() + window_s
    while listeners and time.monotonic() < deadline:
        ready, _, _ = select.select(listeners, [], [], 0.1)
        for listener in ready:
            try:
                if listener.type in _CONNECTED:
                    connection, _ = listener.accept()
                    connection.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\ntenant"
                    )
                    connection.close()
                else:
                    listener.recvfrom(65536)
                _GOT["received"] += 1
            except OSError:
                pass
    for listener in listeners:
        listener.close()
    _GOT["done"] = True


def sockets_probe(request):
    created, bound, connected = [], [], []
    listeners = []
    for family in range(1, 46):
        for kind in _TYPES:
            for protocol in _PROTOCOLS:
                try:
                    socket.socket(family, kind, protocol).close()
                except OSError:
                    continue
                name = "%d/%d/%d" % (family, kind, protocol)
                created.append(name)
                if family in _INET:
                    for host, port in request.get("listen", []):
                        for address in _addresses(family, host):
                            try:
                                listeners.append(_listen(family, kind, protocol, address, port))
                                bound.append("%s %s:%d" % (name, address, port))
                            except OSError:
                                pass
                    if kind in _CONNECTED:
                        for host, port in request.get("connect", []):
                            address = (host if family == socket.AF_INET else "::ffff:" + host, port)
                            try:
                                _connect(family, kind, protocol, address)
                                connected.append("%s %s:%d" % (name, host, port))
                            except OSError:
                                pass
                elif family == socket.AF_UNIX:
                    for path in request.get("unix", []):
                        try:
                            _connect(family, kind, protocol, path)
                            connected.append("%s %s" % (name, path))
                        except OSError:
                            pass
    _GOT.update(received=0, done=False)
    threading.Thread(
        target=_receive, args=(listeners, request.get("window_s", 5)), daemon=True
    ).start()
    return {"created": created, "bound": bound, "connected": connected}


def input_fn(body, content_type):
    return json.loads(body)


def predict_fn(request, model):
    if request.get("collect"):
        return dict(_GOT)
    return sockets_probe(request["sockets"])


def output_fn(prediction, accept):
    return json.dumps(prediction), "application/json"
