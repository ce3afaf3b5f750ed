"""The gRPC listeners' certificate and key, checked before binding: each way a pair can be
wrong gets its own words (gRPC would report every one as a failed bind)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ferry.errors import ConfigError
from ferry.grpc.tls import check_key_pair, server_credentials


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``a.pem``/``a.key`` and ``b.pem``/``b.key`` (two self-signed pairs), ``locked.key``
    (``a.key`` encrypted), ``garbled.pem`` and ``empty.pem``."""
    folder = tmp_path_factory.mktemp("pem")
    for name in ("a", "b"):
        _openssl(
            *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-keyout", str(folder / f"{name}.key")),
            *("-out", str(folder / f"{name}.pem")),
        )
    _openssl(
        *("pkey", "-in", str(folder / "a.key"), "-aes128", "-passout", "pass:secret"),
        *("-out", str(folder / "locked.key")),
    )
    (folder / "garbled.pem").write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n")
    (folder / "empty.pem").write_bytes(b"")
    return folder


def test_a_matching_pair_passes(pem: Path) -> None:
    check_key_pair(pem / "a.pem", pem / "a.key")
    assert server_credentials(pem / "a.pem", pem / "a.key") is not None


def test_a_key_of_another_certificate_is_named_a_mismatch(pem: Path) -> None:
    with pytest.raises(ConfigError, match="the private key does not match the certificate"):
        server_credentials(pem / "a.pem", pem / "b.key")


@pytest.mark.parametrize(
    ("certificate", "key", "words"),
    [
        ("garbled.pem", "a.key", "certificate_file .*garbled.pem holds no PEM certificate"),
        ("empty.pem", "a.key", "certificate_file .*empty.pem holds no PEM certificate"),
        ("a.key", "a.pem", "certificate_file .*a.key holds no PEM certificate"),
        ("a.pem", "garbled.pem", "private_key_file .*garbled.pem holds no PEM private key"),
        ("a.pem", "a.pem", "private_key_file .*a.pem holds no PEM private key"),
        ("a.pem", "locked.key", "private_key_file .*locked.key is encrypted"),
    ],
)
def test_a_file_that_is_not_what_it_should_be_is_named(
    pem: Path, certificate: str, key: str, words: str
) -> None:
    with pytest.raises(ConfigError, match=words):
        server_credentials(pem / certificate, pem / key)


def test_an_unreadable_file_is_named(pem: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read private_key_file .*absent.key: no such"):
        server_credentials(pem / "a.pem", pem / "absent.key")
    with pytest.raises(ConfigError, match=r"cannot read certificate_file .*: is a directory"):
        server_credentials(pem, pem / "a.key")


def test_both_files_are_needed() -> None:
    with pytest.raises(ConfigError, match="enable_grpc_ssl needs certificate_file"):
        server_credentials(None, Path("key.pem"))
