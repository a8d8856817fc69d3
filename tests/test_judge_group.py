"""The judges' own group admits only processes that hold the launch's token, whatever else reaches its port."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import threading
import time
from datetime import timedelta

import pytest

from cuco.runner.judge import group as group_mod
from cuco.runner.judge.group import GroupError, JudgeGroup

TOKEN = secrets.token_hex(32)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _framed(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def _send(sock: socket.socket, obj) -> None:
    sock.sendall(_framed(json.dumps(obj).encode()))


def _exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the connection closed"
        data += chunk
    return data


def _get(sock: socket.socket):
    return json.loads(_exact(sock, int.from_bytes(_exact(sock, 4), "big")))


def _proof(token: str, direction: str, rank: int, nonce: str) -> str:
    msg = f"cuco-judge-group/{direction}/{rank}/{nonce}".encode()
    return hmac.new(token.encode(), msg, hashlib.sha256).hexdigest()


def _dial(port: int) -> socket.socket:
    """A connection to the hub, once it listens (its thread may not have bound the port yet)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=30)
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, "the hub never listened"
            time.sleep(0.005)


def _closed(sock: socket.socket) -> bool:
    """The other end closed the connection without sending anything more."""
    sock.settimeout(30)
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


class Judges:
    """Ranks of one group, each in a thread: what each returned or raised."""

    def __init__(self, world: int, port: int, work, ranks=None, token: str = TOKEN) -> None:
        self.results: dict[int, object] = {}

        def run(rank: int) -> None:
            try:
                g = JudgeGroup(rank, world, port, token, timeout=30)
                try:
                    self.results[rank] = work(g)
                finally:
                    g.close()
            except Exception as exc:  # the test reads it
                self.results[rank] = exc

        self.threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in ranks or range(world)]
        for t in self.threads:
            t.start()

    def join(self) -> dict[int, object]:
        for t in self.threads:
            t.join(60)
            assert not t.is_alive()
        return self.results


def test_three_judges_gather_broadcast_and_agree():
    def work(g: JudgeGroup):
        gathered = g.all_gather({"rank": g.rank, "x": [g.rank] * g.rank})
        g.barrier()
        seed = g.broadcast(secrets.randbits(63) if g.rank == 0 else None)
        t = g.broadcast(1.5 + g.rank, src=2)
        return gathered, seed, t, g.any(g.rank == 1), g.any(False)

    res = Judges(3, _port(), work).join()
    assert [r for r in res.values() if isinstance(r, Exception)] == []
    assert len({json.dumps(r) for r in res.values()}) == 1  # every rank saw the same
    gathered, seed, t, some, none = res[0]
    assert gathered == [{"rank": r, "x": [r] * r} for r in range(3)]
    assert isinstance(seed, int) and t == 3.5 and some is True and none is False


def test_a_world_of_one_opens_no_socket():
    g = JudgeGroup(0, 1, port=0, token="")
    assert g.peers == [] and g.all_gather((1, "a")) == [[1, "a"]] and g.broadcast(7) == 7 and not g.any(False)
    g.close()


def test_a_client_without_the_token_is_refused_and_reads_nothing():
    port = _port()
    hub = Judges(2, port, lambda g: g.all_gather("from the hub"), ranks=[0])
    intruder = _dial(port)
    _send(intruder, {"rank": 1, "nonce": secrets.token_hex(16)})
    challenge = _get(intruder)
    assert set(challenge) == {"nonce", "proof"}  # the hub's half of the handshake, and nothing of the group's
    _send(intruder, {"proof": _proof("not the token", "rank", 1, challenge["nonce"])})
    assert _closed(intruder)
    rank1 = Judges(2, port, lambda g: g.all_gather("from rank 1"), ranks=[1])
    assert hub.join() == {0: ["from the hub", "from rank 1"]}
    assert rank1.join() == {1: ["from the hub", "from rank 1"]}


def test_a_reflected_proof_is_refused():
    """The hub's answer to a nonce of the hub's own is no rank's proof: the direction is in what is signed."""
    port = _port()
    hub = Judges(2, port, lambda g: g.all_gather(0), ranks=[0])
    first = _dial(port)
    _send(first, {"rank": 1, "nonce": secrets.token_hex(16)})
    hubs_nonce = _get(first)["nonce"]
    second = _dial(port)
    _send(second, {"rank": 1, "nonce": hubs_nonce})
    reflected = _get(second)["proof"]
    _send(first, {"proof": reflected})
    assert _closed(first)
    second.close()
    assert Judges(2, port, lambda g: g.all_gather(1), ranks=[1]).join() == {1: [0, 1]}
    assert hub.join() == {0: [0, 1]}


def test_a_hub_without_the_token_is_refused_and_learns_nothing():
    """A process that took the port before rank 0's judge: the judge raises, and sends it no proof and no data."""
    seen = []
    with socket.socket() as fake:
        fake.bind(("127.0.0.1", 0))
        fake.listen()
        port = fake.getsockname()[1]
        rank1 = Judges(2, port, lambda g: g.all_gather("secret"), ranks=[1])
        conn, _ = fake.accept()
        with conn:
            seen.append(_get(conn))
            _send(conn, {"nonce": secrets.token_hex(16), "proof": _proof("a guess", "hub", 1, seen[0]["nonce"])})
            assert _closed(conn)
    (res,) = rank1.join().values()
    assert isinstance(res, GroupError) and "is no judge" in str(res)
    assert set(seen[0]) == {"rank", "nonce"}


def test_a_hub_that_never_answers_is_no_hub(monkeypatch):
    monkeypatch.setattr(group_mod, "HANDSHAKE_S", 0.3)
    with socket.socket() as fake:
        fake.bind(("127.0.0.1", 0))
        fake.listen()
        with pytest.raises(GroupError, match="is no judge"):
            JudgeGroup(1, 2, fake.getsockname()[1], TOKEN, timeout=30)


def test_strangers_on_the_port_do_not_stop_the_judges():
    """A torch TCPStore client, bytes that are no message, a malformed hello, a peer that says nothing: the hub
    drops each, and the real ranks still form the group."""
    import torch.distributed as dist

    port = _port()
    judges = Judges(3, port, lambda g: g.all_gather(g.rank), ranks=[0])
    silent = _dial(port)
    for junk in (b"GET / HTTP/1.0\r\n\r\n", _framed(b"hello"), _framed(b"[1, 2, 3, 4]"),
                 _framed(json.dumps({"rank": True, "nonce": "0" * 32}).encode()),
                 _framed(json.dumps({"rank": 0, "nonce": "0" * 32}).encode()),
                 b"\xff" + secrets.token_bytes(64)):
        with _dial(port) as s:
            s.sendall(junk)
            assert _closed(s), junk
    with pytest.raises(RuntimeError):  # DistNetworkError: every try of the store's client is dropped
        dist.TCPStore("127.0.0.1", port, 3, False, timeout=timedelta(seconds=1))
    others = Judges(3, port, lambda g: g.all_gather(g.rank), ranks=[1, 2])
    assert judges.join() == {0: [0, 1, 2]}
    assert others.join() == {1: [0, 1, 2], 2: [0, 1, 2]}
    silent.close()


def test_no_rank_joins_in_time():
    with pytest.raises(GroupError, match=r"rank\(s\) \[1\] did not join"):
        JudgeGroup(0, 2, _port(), TOKEN, timeout=0.2)
