"""The launcher's handle on its judges' zygote (zygote.py): started on first use, a judge forked per request,
each judge's exit code as the zygote reports it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

MAX_MESSAGE = 1 << 20  # a request carries an environment: tens of kilobytes at most
WAIT_POLL_S = 0.005


class ZygoteGone(RuntimeError):
    pass


class Judge:
    """A judge forked by the zygote, as subprocess.Popen shows a process (pid, poll, wait, send_signal,
    returncode): what the launcher's watchdog uses. Its exit code comes from the zygote, its parent."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.pid, self.returncode, self._zygote = pid, None, zygote

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(f"judge {self.pid}", timeout)
            time.sleep(WAIT_POLL_S)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


class Zygote:
    """The launcher's side. Thread-safe: a search's evaluation slots launch from threads of their own."""

    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [sys.executable, "-u", "-m", "cuco.runner.processes.zygote", str(theirs.fileno())]
        self._proc = subprocess.Popen(command,
                                      pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        theirs.close()
        self._sock, self._lock = ours, threading.Lock()
        self._exits: dict[int, int] = {}
        self._alive: set[int] = set()
        self.gone = False

    def fork(self, args: list[str], env: dict[str, str], cwd: str, log_fd: int, token_fd: int) -> Judge:
        """A judge running rank.main(ARGS) in CWD under ENV, its output in LOG_FD, its token in TOKEN_FD."""
        request = json.dumps({"args": args, "env": env, "cwd": cwd}).encode()
        with self._lock:
            try:
                socket.send_fds(self._sock, [request], [log_fd, token_fd])
                while (pid := self._take(self._receive(block=True))) is None:
                    pass
            except OSError as exc:
                raise self._lost(exc) from exc
            self._alive.add(pid)
        return Judge(self, pid)

    def exit_code(self, pid: int) -> int | None:
        with self._lock:
            while not self.gone:
                try:
                    message = self._receive(block=False)
                except BlockingIOError:
                    break
                except (ZygoteGone, OSError):
                    self._lost(None)
                    break
                self._take(message)
            return self._exits.pop(pid, None)

    def _receive(self, block: bool) -> dict:
        data = self._sock.recv(MAX_MESSAGE, 0 if block else socket.MSG_DONTWAIT)
        if not data:
            raise ZygoteGone("the judges' zygote exited")
        return json.loads(data)

    def _take(self, message: dict) -> int | None:
        """An exit is filed; a new judge's pid is returned."""
        if "exit" in message:
            self._exits[message["exit"]] = message["code"]
            self._alive.discard(message["exit"])
            return None
        return message["pid"]

    def _lost(self, exc: BaseException | None) -> ZygoteGone:
        """The zygote died: every judge it held died with it (their parent-death signal)."""
        self.gone = True
        for pid in self._alive:
            self._exits[pid] = -signal.SIGKILL
        self._alive.clear()
        self._sock.close()
        return ZygoteGone(f"the judges' zygote exited ({exc or 'its socket closed'})")

    def exited(self) -> bool:
        return self._proc.poll() is not None


_zygote: Zygote | None = None
_zygote_lock = threading.Lock()


def zygote(env: dict[str, str]) -> Zygote:
    """This process's zygote, started under ENV (its PYTHONPATH and the variables libraries read as they load,
    OMP_NUM_THREADS among them) on first use, and again after it died."""
    global _zygote
    with _zygote_lock:
        if _zygote is None or _zygote.gone or _zygote.exited():
            _zygote = Zygote(env)
        return _zygote


