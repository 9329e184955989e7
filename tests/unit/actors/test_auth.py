"""Tests of danaus._auth (the HMAC challenge-response proofs) and of the job key the actor
layer keeps (``ActorProcess.job_key``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from danaus._auth import new_nonce, proof, verify
from danaus.actors._process import process
from danaus.config import config

KEY = b"k" * 32
A_NONCE = b"a" * 16
D_NONCE = b"d" * 16


@pytest.fixture(autouse=True)
def _the_job_key_kept() -> Iterator[None]:
    """Each test may change this process's job key; the next finds it as it was."""
    old = process._job_key
    yield
    process.set_job_key(old)


def test_proof_verifies_with_the_same_inputs() -> None:
    mac = proof(KEY, b"dialer", A_NONCE, D_NONCE)

    assert len(mac) == 32  # HMAC-SHA256
    assert proof(KEY, b"dialer", A_NONCE, D_NONCE) == mac
    assert verify(KEY, b"dialer", A_NONCE, D_NONCE, mac)


def test_wrong_key_fails() -> None:
    mac = proof(b"w" * 32, b"dialer", A_NONCE, D_NONCE)

    assert not verify(KEY, b"dialer", A_NONCE, D_NONCE, mac)


def test_swapped_nonces_fail() -> None:
    mac = proof(KEY, b"dialer", D_NONCE, A_NONCE)

    assert not verify(KEY, b"dialer", A_NONCE, D_NONCE, mac)


def test_wrong_side_label_fails() -> None:
    """A proof made by the acceptor cannot be reflected back as the dialer's."""
    mac = proof(KEY, b"acceptor", A_NONCE, D_NONCE)

    assert not verify(KEY, b"dialer", A_NONCE, D_NONCE, mac)


def test_other_nonce_fails() -> None:
    mac = proof(KEY, b"dialer", A_NONCE, D_NONCE)

    assert not verify(KEY, b"dialer", A_NONCE, b"e" * 16, mac)
    assert not verify(KEY, b"dialer", b"b" * 16, D_NONCE, mac)


@pytest.mark.parametrize("mac", [b"", b"\x00" * 32, b"x" * 31])
def test_malformed_mac_fails(mac: bytes) -> None:
    assert not verify(KEY, b"dialer", A_NONCE, D_NONCE, mac)


def test_truncated_mac_fails() -> None:
    mac = proof(KEY, b"dialer", A_NONCE, D_NONCE)

    assert not verify(KEY, b"dialer", A_NONCE, D_NONCE, mac[:16])


def test_proof_binds_the_exact_pair_of_nonces() -> None:
    mac = proof(KEY, b"dialer", b"a|b", b"c")

    assert not verify(KEY, b"dialer", b"a", b"b|c", mac)


def test_new_nonce_is_16_fresh_bytes() -> None:
    nonces = {new_nonce() for _ in range(100)}

    assert len(nonces) == 100
    assert all(len(n) == 16 for n in nonces)


def test_job_key_comes_from_config_auth_key(monkeypatch: pytest.MonkeyPatch) -> None:
    process.set_job_key(None)
    monkeypatch.setattr(config, "auth_key", "00ff" * 8)

    assert process.job_key() == bytes.fromhex("00ff" * 8)
    assert process.job_key() == bytes.fromhex("00ff" * 8)


def test_job_key_without_config_is_random_and_stable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "auth_key", "")
    process.set_job_key(None)
    first = process.job_key()
    process.set_job_key(None)
    second = process.job_key()

    assert len(first) == 32
    assert first != second  # a fresh secret per job
    assert process.job_key() == second  # and the same one for the whole job


def test_set_job_key_is_adopted(monkeypatch: pytest.MonkeyPatch) -> None:
    process.set_job_key(None)
    process.set_job_key(b"handed down by the controller!!!")

    assert process.job_key() == b"handed down by the controller!!!"
