"""The judges' own group: rank 0's judge is the hub, every other judge holds one TCP connection to it on loopback.

The candidate runs on the same machine and can reach any loopback port, so nothing crosses a connection before both
ends have proven that they hold the launch's token (through CUCO_JUDGE_TOKEN_FD; no candidate holds it): each sends a
fresh nonce and answers the other's with HMAC-SHA256(token, direction, rank, nonce), so a replayed or reflected
answer fails. The hub drops a peer that fails; a judge whose hub fails raises, so a process that took the port first
can neither read the judges' messages nor feed them its own. Messages are length-prefixed JSON, never pickle."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import threading
import time
from typing import Any

HOST = "127.0.0.1"
TIMEOUT_S = 120.0  # for every rank to join
HANDSHAKE_S = 10.0  # for one peer to prove itself: a peer that stalls is dropped without holding up the others
HANDSHAKE_BYTES = 512  # the longest handshake message: a peer not yet proven cannot make the hub read more
NONCE_BYTES = 16
RETRY_S = 0.02  # between a judge's tries to reach a hub that does not listen yet


class GroupError(RuntimeError):
    """The judges' group could not form, or lost one of its judges."""


def _proof(token: str, direction: str, rank: int, nonce: str) -> bytes:
    msg = f"cuco-judge-group/{direction}/{rank}/{nonce}".encode()
    return hmac.new(token.encode(), msg, hashlib.sha256).hexdigest().encode()


def _send(sock: socket.socket, obj: Any) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(len(data).to_bytes(4, "big") + data)


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        if not (chunk := sock.recv(min(n - len(data), 1 << 20))):
            raise ConnectionError("the connection closed")
        data += chunk
    return data


def _recv(sock: socket.socket, limit: int | None = None) -> Any:
    size = int.from_bytes(_read(sock, 4), "big")
    if limit is not None and size > limit:
        raise ValueError(f"a handshake message of {size} bytes")
    return json.loads(_read(sock, size))


def _fields(msg: Any, **kinds: type) -> list[Any]:
    """The named fields of a handshake message, each of exactly its type (a bool is no rank), or ValueError."""
    if not isinstance(msg, dict) or set(msg) != set(kinds) or any(type(msg[k]) is not t for k, t in kinds.items()):
        raise ValueError(f"a malformed handshake message: {str(msg)[:80]!r}")
    return [msg[k] for k in kinds]


class JudgeGroup:
    """The judges of one evaluation, `world` of them; every operation is a collective that all of them call."""

    def __init__(self, rank: int, world: int, port: int, token: str, timeout: float = TIMEOUT_S) -> None:
        self.rank, self.world, self.port, self.timeout = rank, world, port, timeout
        self.peers: list[socket.socket] = []  # the hub's: ranks 1..world-1 in order; another rank's: the hub
        if world == 1:
            return
        if not token:
            raise GroupError("the judges' group has no token: CUCO_JUDGE_TOKEN_FD is not set")
        self.deadline = time.monotonic() + timeout
        self.peers = self._serve(token) if rank == 0 else [self._join(token)]
        for s in self.peers:
            s.settimeout(None)  # a collective waits as long as the slowest judge: the launcher's watchdog bounds it
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # barriers sit in timed loops

    def _serve(self, token: str) -> list[socket.socket]:
        """Rank 0: accept until every other rank has proven itself, each in a thread: a silent peer holds up no one."""
        joined: dict[int, socket.socket] = {}
        formed = threading.Condition()

        def admit(conn: socket.socket) -> None:
            try:
                conn.settimeout(HANDSHAKE_S)
                rank = self._prove_peer(conn, token)
            except (OSError, ValueError):  # a failed handshake or a timeout: that peer is dropped
                conn.close()
                return
            with formed:
                kept = joined.setdefault(rank, conn)  # a rank that joins twice keeps its first connection
                formed.notify()
            if kept is not conn:
                conn.close()

        def accept() -> None:
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:  # shut down: the group formed or gave up
                    return
                threading.Thread(target=admit, args=(conn,), daemon=True, name="cuco-judge-admit").start()

        with socket.socket() as srv:
            srv.bind((HOST, self.port))
            srv.listen(64)
            acceptor = threading.Thread(target=accept, daemon=True, name="cuco-judge-accept")
            acceptor.start()
            with formed:
                done = formed.wait_for(lambda: len(joined) == self.world - 1, self.deadline - time.monotonic())
                peers = dict(joined)
            srv.shutdown(socket.SHUT_RDWR)  # wakes the acceptor (Linux): nothing is accepted past this point
            acceptor.join()
        if not done:
            for conn in peers.values():
                conn.close()
            missing = [r for r in range(1, self.world) if r not in peers]
            raise GroupError(f"the judges' group: rank(s) {missing} did not join within {self.timeout:g} s")
        return [peers[r] for r in range(1, self.world)]

    def _prove_peer(self, conn: socket.socket, token: str) -> int:
        """The hub's half of the handshake: the peer's rank, once it has proven that it holds the token."""
        rank, theirs = _fields(_recv(conn, HANDSHAKE_BYTES), rank=int, nonce=str)
        if not 0 < rank < self.world or len(theirs) != 2 * NONCE_BYTES:
            raise ValueError(f"a hello for rank {rank}")
        mine = secrets.token_hex(NONCE_BYTES)
        _send(conn, {"nonce": mine, "proof": _proof(token, "hub", rank, theirs).decode()})
        (proof,) = _fields(_recv(conn, HANDSHAKE_BYTES), proof=str)
        if not hmac.compare_digest(proof.encode(), _proof(token, "rank", rank, mine)):
            raise ValueError(f"a wrong proof for rank {rank}")
        return rank

    def _join(self, token: str) -> socket.socket:
        """Another rank's half: reach the hub (it may not listen yet); join only once it has proven its token."""
        while True:
            try:
                conn = socket.create_connection((HOST, self.port), timeout=HANDSHAKE_S)
                break
            except OSError as exc:  # refused, most often: rank 0's judge is still starting
                if time.monotonic() > self.deadline:
                    raise GroupError(f"rank {self.rank}: no judges' hub at port {self.port} within "
                                     f"{self.timeout:g} s: {exc}") from None
                time.sleep(RETRY_S)
        try:
            conn.settimeout(HANDSHAKE_S)
            mine = secrets.token_hex(NONCE_BYTES)
            _send(conn, {"rank": self.rank, "nonce": mine})
            theirs, proof = _fields(_recv(conn, HANDSHAKE_BYTES), nonce=str, proof=str)
            if not hmac.compare_digest(proof.encode(), _proof(token, "hub", self.rank, mine)):
                raise ValueError("it does not hold this launch's token")
            _send(conn, {"proof": _proof(token, "rank", self.rank, theirs).decode()})
        except (OSError, ValueError) as exc:
            conn.close()
            raise GroupError(f"rank {self.rank}: the process at port {self.port} is no judge: {exc}") from None
        return conn

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj` (JSON), in rank order: each sends it to the hub, which sends the list back."""
        if self.world == 1:
            return [json.loads(json.dumps(obj))]
        try:
            if self.rank:
                _send(self.peers[0], obj)
                return _recv(self.peers[0])
            everyone = [json.loads(json.dumps(obj)), *(_recv(s) for s in self.peers)]
            for s in self.peers:
                _send(s, everyone)
            return everyone
        except OSError as exc:
            raise GroupError(f"rank {self.rank}: the judges' group lost one of its judges: {exc}") from None

    def barrier(self) -> None:
        self.all_gather(None)

    def any(self, flag: bool) -> bool:
        return any(self.all_gather(bool(flag)))

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return self.all_gather(obj if self.rank == src else None)[src]

    def close(self) -> None:
        for s in self.peers:
            s.close()
        self.peers = []
