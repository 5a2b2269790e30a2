"""Checks HOST:PORT strings before moolib sees them: its parser aborts the process on bad ones."""

import socket


def parse_address(text, allow_port_zero=False):
    """Return (host, port) for "HOST:PORT" or "[IPv6]:PORT"; raise ValueError naming the problem.

    The host must resolve. Port 0 (pick a free port) is accepted only where allow_port_zero.
    """
    if not isinstance(text, str) or ":" not in text:
        raise ValueError(f"address {text!r} is not of the form HOST:PORT (e.g. 127.0.0.1:4431)")
    host, _, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise ValueError(f"address {text!r} has no host (e.g. 127.0.0.1:4431)")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"address {text!r}: port {port_text!r} is not a number") from None
    lowest = 0 if allow_port_zero else 1
    if not lowest <= port <= 65535:
        raise ValueError(f"address {text!r}: port must be between {lowest} and 65535")
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(f"address {text!r}: cannot resolve host {host!r} ({e})") from None
    return host, port


def format_address(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def with_free_port(text):
    """Resolve "HOST:0" to HOST and a port that is free right now; other addresses pass through."""
    host, port = parse_address(text, allow_port_zero=True)
    if port == 0:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    return format_address(host, port)
