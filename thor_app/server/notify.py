"""sd_notify without a dependency: one datagram per message to ``$NOTIFY_SOCKET``.

systemd's protocol is newline-separated ``KEY=VALUE`` lines in one datagram on an AF_UNIX
socket; a leading '@' names the abstract namespace. With no ``$NOTIFY_SOCKET`` (not under
systemd) every send is a no-op, so the server runs the same from a shell.

The watchdog ping comes from a task on the serving event loop, so a loop that stops turning
stops the pings; and it is withheld while the running generation has made no progress for
``stall_s`` (a hung kernel or a dead lock in the worker), so systemd restarts either.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Callable, Mapping

log = logging.getLogger("thor.serve")


class Notifier:
    def __init__(self, address: str | None):
        self.address = address or None
        self._sock: socket.socket | None = None
        self._dropping = False  # warn once per run of dropped messages, not once a second
        if self.address:
            # Non-blocking: a receiver that stops reading fills its queue (10 datagrams by
            # default), and a blocking send would then freeze the serving loop with it.
            self._sock = socket.socket(
                socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "Notifier":
        return cls(env.get("NOTIFY_SOCKET"))

    def send(self, *lines: str) -> bool:
        if self._sock is None:
            return False
        addr = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            self._sock.sendto("\n".join(lines).encode(), addr)
            self._dropping = False
            return True
        except BlockingIOError:
            if not self._dropping:
                log.warning(
                    "sd_notify to %s: the receiver's queue is full; dropping messages", self.address
                )
            self._dropping = True
            return False
        except OSError as e:  # systemd gone or socket removed: the service keeps serving
            log.warning("sd_notify to %s failed: %s", self.address, e)
            return False

    async def send_reliably(self, *lines: str, timeout_s: float = 30.0) -> bool:
        """For the messages that must not be dropped (READY=1): wait, off the loop's time, for
        room in the receiver's queue."""
        if self._sock is None:
            return False
        addr = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            await asyncio.wait_for(
                asyncio.get_running_loop().sock_sendto(self._sock, "\n".join(lines).encode(), addr),
                timeout_s,
            )
            return True
        except (OSError, asyncio.TimeoutError) as e:
            log.warning("sd_notify %s to %s failed: %s", lines[0], self.address, e or "timed out")
            return False

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval(env: Mapping[str, str] = os.environ, pid: int | None = None) -> float | None:
    """Seconds between pings (half of WatchdogSec), or None when systemd asked for none."""
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    want_pid = env.get("WATCHDOG_PID")
    if want_pid and want_pid.isdigit() and int(want_pid) != (pid or os.getpid()):
        return None  # the variables were meant for another process (inherited)
    try:
        us = int(usec)
    except ValueError:
        return None
    return us / 2e6 if us > 0 else None


async def watchdog_loop(notifier: Notifier, interval_s: float, healthy: Callable[[], bool]) -> None:
    """Ping while ``healthy()``; runs until cancelled."""
    warned = False
    while True:
        if healthy():
            notifier.send("WATCHDOG=1")
            warned = False
        elif not warned:
            log.error("generation made no progress: withholding the watchdog ping")
            warned = True
        await asyncio.sleep(interval_s)
