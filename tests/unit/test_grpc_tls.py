"""The gRPC listeners' certificate and key, checked before binding: each way a pair can be
wrong gets its own words (gRPC would report every one as a failed bind)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from ferry.errors import ConfigError
from ferry.grpc.tls import check_key_pair, server_credentials


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``a.pem``/``a.key`` and ``b.pem``/``b.key`` (two self-signed pairs), ``weak.pem``/
    ``weak.key`` (1024-bit RSA, as TorchServe's test certificate), ``locked.key`` (``a.key``
    encrypted), ``garbled.pem`` and ``empty.pem``."""
    folder = tmp_path_factory.mktemp("pem")
    for name, bits in (("a", 2048), ("b", 2048), ("weak", 1024)):
        _openssl(
            *("req", "-x509", "-newkey", f"rsa:{bits}", "-nodes", "-days", "1"),
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


def test_a_key_the_security_level_refuses_is_named_with_its_size_and_the_fix(pem: Path) -> None:
    """OpenSSL's default security level (2) refuses RSA keys under 2048 bits; its own
    words, "ee key too small", became "holds no PEM private key" before."""
    with pytest.raises(ConfigError) as refused:
        server_credentials(pem / "weak.pem", pem / "weak.key")
    assert refused.value.message == (
        f"gRPC TLS: certificate_file {pem / 'weak.pem'} has a 1024-bit RSA key; OpenSSL's "
        "security level 2 needs RSA keys of at least 2048 bits (EC: 224): make a 2048-bit "
        "pair: openssl req -x509 -nodes -days 365 -newkey rsa:2048 -sha256 -subj /CN=localhost "
        f"-keyout {pem / 'weak.key'} -out {pem / 'weak.pem'}"
    )
    assert "\n" not in refused.value.message


def test_the_command_a_refusal_suggests_makes_a_pair_that_passes(pem: Path, tmp_path: Path) -> None:
    certificate, key = tmp_path / "my cert.pem", tmp_path / "my key.pem"  # quoted in the line
    shutil.copy(pem / "weak.pem", certificate)
    shutil.copy(pem / "weak.key", key)
    with pytest.raises(ConfigError) as refused:
        check_key_pair(certificate, key)
    command = refused.value.message.split(": ")[-1]
    assert command.startswith("openssl req ")
    subprocess.run(shlex.split(command), check=True, capture_output=True)
    check_key_pair(certificate, key)


def test_an_unreadable_file_is_named(pem: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read private_key_file .*absent.key: no such"):
        server_credentials(pem / "a.pem", pem / "absent.key")
    with pytest.raises(ConfigError, match=r"cannot read certificate_file .*: is a directory"):
        server_credentials(pem, pem / "a.key")


def test_both_files_are_needed() -> None:
    with pytest.raises(ConfigError, match="enable_grpc_ssl needs certificate_file"):
        server_credentials(None, Path("key.pem"))
