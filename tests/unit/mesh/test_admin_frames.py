"""The admin endpoint's frames and addresses, without sockets."""

from __future__ import annotations

import pytest

from danaus.mesh._admin.wire import AdminError, _normalize, _open, _seal, _session_keys

KEY = b"k" * 32


def _split(frame: bytes) -> tuple[int, bytes, bytes]:
    return int.from_bytes(frame[:4], "big"), frame[4:36], frame[36:]


def test_a_sealed_frame_opens_at_its_position_only() -> None:
    size, mac, payload = _split(_seal(KEY, 7, {"id": 1, "op": "snapshot", "args": {}}))
    assert size == len(payload)
    assert _open(KEY, 7, mac, payload) == {"id": 1, "op": "snapshot", "args": {}}
    with pytest.raises(AdminError, match="integrity"):
        _open(KEY, 8, mac, payload)  # replayed later
    with pytest.raises(AdminError, match="integrity"):
        _open(b"x" * 32, 7, mac, payload)  # another connection's key
    with pytest.raises(AdminError, match="integrity"):
        _open(KEY, 7, mac, payload.replace(b"snapshot", b"stacks!!"))  # tampered


def test_text_that_is_not_utf8_or_json_is_refused_clearly() -> None:
    import hashlib
    import hmac

    for payload in (b"\xff\xfe not utf-8", b"{not json"):
        mac = hmac.new(KEY, (0).to_bytes(8, "big") + payload, hashlib.sha256).digest()
        with pytest.raises(AdminError, match="not JSON"):
            _open(KEY, 0, mac, payload)


def test_values_that_json_cannot_hold_travel_as_their_repr() -> None:
    class Odd:
        def __repr__(self) -> str:
            return "<odd \udcff>"  # not even encodable as UTF-8

    _, mac, payload = _split(_seal(KEY, 0, {"v": Odd(), "s": {1}}))
    got = _open(KEY, 0, mac, payload)
    assert got["s"] == [1] and got["v"].startswith("<odd")


def test_the_two_directions_of_a_connection_have_different_keys() -> None:
    up, down = _session_keys(KEY, b"c" * 16, b"s" * 16)
    assert up != down
    assert _session_keys(KEY, b"c" * 16, b"t" * 16)[0] != up  # fresh per connection


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ("9999", "tcp://127.0.0.1:9999"),
        ("unix:@x", "unix:@x"),
        ("unix:/tmp/a", "unix:/tmp/a"),
        ("tcp://0.0.0.0:1", "tcp://0.0.0.0:1"),
    ],
)
def test_admin_addresses(given: str, want: str) -> None:
    assert _normalize(given) == want


def test_auto_is_a_fresh_abstract_socket_and_nonsense_is_refused() -> None:
    a, b = _normalize("auto"), _normalize("auto")
    assert a.startswith("unix:@danaus-admin-") and a != b
    with pytest.raises(ValueError, match="admin address 'http://x'"):
        _normalize("http://x")
