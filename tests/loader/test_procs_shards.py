"""SharedShards (shards passed between loader worker processes): a shard asked of a peer that is
lost never leaves the asking build waiting."""

from __future__ import annotations

import contextlib
import pickle
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

from datamill.loader.procs_shards import SharedShards

_JOIN_S = 20.0


@pytest.mark.parametrize(
    ("fault", "says"),
    [("garbage", "sent a message that cannot be read"), ("exit", "exited")],
)
def test_a_shard_asked_of_a_lost_peer_fails_instead_of_waiting(fault: str, says: str) -> None:
    """Regression: a message from a peer that could not be read ended the listener thread, and
    the build waiting for that peer's answer (and every later one) waited for ever."""
    mine, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    shards = SharedShards(0, 2, {1: mine}, lambda k: pa.table({"k": [k]}), keep=1)
    got: list[Any] = []

    def read() -> None:
        try:
            got.append(shards.read(1))  # shard 1 is worker 1's: asked of the peer
        except Exception as exc:  # noqa: BLE001 - what the read raised is the answer
            got.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    data, _, _, _ = socket.recv_fds(peer, 1 << 16, 1)
    assert pickle.loads(data)[:3:2] == ("get", 1)
    if fault == "garbage":
        peer.send(b"not a pickle")
    else:
        peer.close()
    thread.join(_JOIN_S)
    assert not thread.is_alive(), f"the read still waits after {_JOIN_S} s"
    assert isinstance(got[0], RuntimeError) and f"loader worker 1 {says}" in str(got[0])
    with pytest.raises(RuntimeError, match=f"loader worker 1 {says}"):
        shards.read(3)  # asked later: fails at once
    assert shards.read(0).to_pydict() == {"k": [0]}  # its own shards still read
    peer.close()
    mine.close()


def _kinds(k: int) -> pa.Table:
    """Shard ``k``: numbers, strings, binary (one of them long), lists and nulls."""
    return pa.table(
        {
            "uid": pa.array([10 * k + i for i in range(5)], pa.int64()),
            "text": pa.array(["a", None, "ccc" * k, "", "é"]),
            "blob": pa.array([b"\x00" * 3000, b"x", None, b"", bytes(range(k + 1))]),
            "ids": pa.array([[1, 2], [], None, [k], [3, 4, 5]], pa.list_(pa.int32())),
            "score": pa.array([0.5, None, 1.5, 2.5, float(k)], pa.float32()),
        }
    )


@contextlib.contextmanager
def _two_workers(read: Callable[[int], pa.Table]) -> Iterator[tuple[SharedShards, SharedShards]]:
    """Workers 0 and 1 sharing their shards over a socket pair, each reading with ``read``."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        yield SharedShards(0, 2, {1: a}, read, keep=8), SharedShards(1, 2, {0: b}, read, keep=8)
    finally:
        a.close()
        b.close()


def test_a_shard_passed_to_a_peer_is_the_same_table() -> None:
    """Each worker reads its own shards (``k % 2``) and gets the others' from their owner, as an
    Arrow IPC stream written into a ``memfd`` and mapped read-only: every column kind arrives as it
    was read, and an empty shard too."""

    def read(k: int) -> pa.Table:
        return _kinds(k) if k < 4 else _kinds(k).slice(0, 0)

    with _two_workers(read) as (w0, w1):
        for k in range(6):
            for w in (w0, w1):  # one of them owns k, the other asks its owner
                got = w.read(k)
                assert got.equals(read(k)), (k, w.me)
                assert got.schema == read(k).schema


def test_a_shard_that_cannot_be_read_fails_in_its_owner_and_in_the_peer_that_asks() -> None:
    """A read error of the owner reaches both the owner's build and the peer's, named, at once (no
    wait); a later shard still passes."""

    def read(k: int) -> pa.Table:
        if k == 2:
            raise OSError("disk says no (shard 2)")
        return _kinds(k)

    got: list[Any] = []

    def ask(w1: SharedShards) -> None:
        try:
            got.append(w1.read(2))  # shard 2 is worker 0's
        except Exception as exc:  # noqa: BLE001 - what the read raised is the answer
            got.append(exc)

    with _two_workers(read) as (w0, w1):
        thread = threading.Thread(target=ask, args=(w1,), daemon=True)
        thread.start()
        thread.join(_JOIN_S)
        assert not thread.is_alive(), f"the peer's read still waits after {_JOIN_S} s"
        assert isinstance(got[0], RuntimeError)
        assert "worker 0 reading a shard: OSError: disk says no (shard 2)" in str(got[0])
        with pytest.raises(OSError, match="disk says no"):
            w0.read(2)
        assert w1.read(4).equals(_kinds(4))  # worker 0's next shard still passes
