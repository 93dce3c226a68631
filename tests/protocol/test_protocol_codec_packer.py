"""``codec.encode`` reuses one msgpack Packer per thread: a failed encode leaves
nothing behind for the next one, and threads never mix their output."""

from __future__ import annotations

import threading

import msgpack
import pytest

from protocol.codec import decode, encode


def test_a_failed_encode_leaves_nothing_for_the_next() -> None:
    with pytest.raises(TypeError):
        encode({"blob": b"x" * 10_000, "bad": object()})
    assert encode({"error": None, "resources_epoch": 3}) == msgpack.packb(
        {"error": None, "resources_epoch": 3}, use_bin_type=True)


def test_bytes_and_strings_keep_their_types() -> None:
    doc = {"member_id": "m", "assignment": b"\x01\x02", "n": [1, -1, 2**40, 1.5, None, True]}
    assert decode(encode(doc)) == doc
    assert encode(doc) == msgpack.packb(doc, use_bin_type=True)


def test_threads_encoding_at_once_get_their_own_documents() -> None:
    wrong: list[int] = []

    def work(n: int) -> None:
        doc = {"thread": n, "payload": [str(n) * 50] * 20}
        expected = msgpack.packb(doc, use_bin_type=True)
        for _ in range(2_000):
            if encode(doc) != expected:
                wrong.append(n)
                return

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not wrong
