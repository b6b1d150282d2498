"""Free TCP ports on 127.0.0.1 for the servers and Ray heads the tests start on fixed ports."""

import random
import socket

LOW, HIGH = 20000, 32767


def free_ports(n: int) -> list[int]:
    """n distinct ports that bind on 127.0.0.1 now, drawn from 20000-32767: below the kernel's ephemeral range
    (32768-60999 on Linux), so no port the kernel hands out (an outgoing connection, a `bind(0)` of a Ray session or
    server in another test worker) lands on one between this check and its server binding it; above Ray's worker
    ports (10002-19999)."""
    out: list[int] = []
    for port in random.sample(range(LOW, HIGH + 1), HIGH + 1 - LOW):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        out.append(port)
        if len(out) == n:
            return out
    raise RuntimeError(f"fewer than {n} free ports in {LOW}-{HIGH}")


def free_port() -> int:
    return free_ports(1)[0]
