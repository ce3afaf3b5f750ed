"""The gRPC listeners' TLS credentials, checked before anything binds.

gRPC reports every problem with a certificate and key the same way: ``add_secure_port``
fails as if it could not bind (and logs "Invalid private key" to stderr). So the pair is
loaded here first with ``ssl`` (the standard library, no new dependency), and a file that
cannot be read, is not PEM, holds an encrypted key (gRPC takes no passphrase), a key that
does not belong to the certificate, or one OpenSSL's security level refuses stops start-up
with a ``ConfigError`` that says which.

The security level's words (``security_level_refusal``) are the HTTPS listeners' too, so
this module imports grpcio only where it makes the credentials.
"""

from __future__ import annotations

import base64
import re
import shlex
import ssl
from pathlib import Path
from typing import TYPE_CHECKING

from ferry.errors import ConfigError

if TYPE_CHECKING:
    import grpc


class _Encrypted(Exception):
    """Raised by the password callback: OpenSSL asks for one only for an encrypted key."""


def _no_password() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal, stalling start-up.
    raise _Encrypted


def server_credentials(
    certificate_file: Path | None, private_key_file: Path | None
) -> grpc.ServerCredentials:
    """The credentials of a ``grpcs://`` listener, once the pair is known to work."""
    if certificate_file is None or private_key_file is None:
        raise ConfigError("enable_grpc_ssl needs certificate_file and private_key_file")
    certificate = _read(certificate_file, "certificate_file")
    key = _read(private_key_file, "private_key_file")
    check_key_pair(certificate_file, private_key_file)
    import grpc  # the grpc extra is installed: only gRPC listeners get here

    return grpc.ssl_server_credentials([(key, certificate)])


def _read(path: Path, setting: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        reason = (error.strerror or str(error)).lower()
        raise ConfigError(f"gRPC TLS: cannot read {setting} {path}: {reason}") from None


def check_key_pair(certificate_file: Path, private_key_file: Path) -> None:
    """Raise ``ConfigError`` naming what is wrong unless the PEM certificate (chain) and
    the unencrypted PEM private key load together and belong together."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certificate_file, private_key_file, password=_no_password)
    except _Encrypted:
        raise ConfigError(
            f"gRPC TLS: private_key_file {private_key_file} is encrypted; "
            "gRPC needs an unencrypted key"
        ) from None
    except ssl.SSLError as error:
        raise ConfigError(_what_is_wrong(error, certificate_file, private_key_file)) from None
    except OSError as error:  # gone or unreadable since it was read
        raise ConfigError(f"gRPC TLS: cannot load the certificate or key: {error}") from None


def _what_is_wrong(error: ssl.SSLError, certificate_file: Path, private_key_file: Path) -> str:
    # OpenSSL says "PEM lib" for any file it cannot parse, whichever it is: tell them apart
    # by whether the certificate file parses on its own.
    refusal = security_level_refusal(error, certificate_file, private_key_file)
    if refusal is not None:
        return f"gRPC TLS: {refusal}"
    if error.reason == "KEY_VALUES_MISMATCH":
        return (
            f"gRPC TLS: the private key does not match the certificate: private_key_file "
            f"{private_key_file} is not the key of certificate_file {certificate_file}"
        )
    if not _holds_certificate(certificate_file):
        return f"gRPC TLS: certificate_file {certificate_file} holds no PEM certificate"
    return f"gRPC TLS: private_key_file {private_key_file} holds no PEM private key"


def _holds_certificate(path: Path) -> bool:
    try:
        text = path.read_bytes().decode("latin-1")  # PEM is ASCII; anything else fails below
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=text)
    except (OSError, ValueError, ssl.SSLError):  # ValueError: an empty file
        return False
    return True


_RSA_BITS = {0: 0, 1: 1024, 2: 2048, 3: 3072, 4: 7680, 5: 15360}
_EC_BITS = {0: 0, 1: 160, 2: 224, 3: 256, 4: 384, 5: 512}
"""The smallest RSA and EC keys each OpenSSL security level accepts."""
_RSA_ENCRYPTION = bytes.fromhex("2a864886f70d010101")  # the OID 1.2.840.113549.1.1.1


def security_level_refusal(
    error: ssl.SSLError, certificate_file: Path, private_key_file: Path
) -> str | None:
    """One line naming the file, why OpenSSL's security level refuses it and how to make
    a pair it takes, when ``error`` is such a refusal (a key too small, a signature digest
    too weak); None for any other error. The level itself stays: Python's ``ssl`` default,
    OpenSSL level 2, refuses the 1024-bit RSA certificate of TorchServe's tests."""
    if error.reason not in ("EE_KEY_TOO_SMALL", "CA_KEY_TOO_SMALL", "CA_MD_TOO_WEAK"):
        return None
    level = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).security_level
    rsa, ec = _RSA_BITS.get(level, 2048), _EC_BITS.get(level, 224)
    size = max(rsa, 2048)
    fix = (
        f"openssl req -x509 -nodes -days 365 -newkey rsa:{size} -sha256 -subj /CN=localhost "
        f"-keyout {shlex.quote(str(private_key_file))} -out {shlex.quote(str(certificate_file))}"
    )
    needs = f"OpenSSL's security level {level}"
    if error.reason == "CA_MD_TOO_WEAK":
        return (
            f"certificate_file {certificate_file} holds a certificate signed with a digest "
            f"{needs} refuses (MD5 or SHA-1): have it re-issued signed with SHA-256, or make "
            f"a self-signed pair: {fix}"
        )
    bits = _rsa_bits(certificate_file) if error.reason == "EE_KEY_TOO_SMALL" else None
    holder = f"certificate_file {certificate_file}"
    if error.reason == "CA_KEY_TOO_SMALL":
        holder = f"a CA certificate in certificate_file {certificate_file}"
    key = f"a {bits}-bit RSA key" if bits else "a key too small"
    return (
        f"{holder} has {key}; {needs} needs RSA keys of at least {rsa} bits (EC: {ec}): "
        f"make a {size}-bit pair: {fix}"
    )


def _rsa_bits(certificate_file: Path) -> int | None:
    """The size of the RSA key of the file's first certificate (a chain's own, the one
    the key file belongs to); None for another kind of key or a file that will not read."""
    try:
        text = certificate_file.read_text(encoding="latin-1")
        pem = re.search(r"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", text, re.S)
        der = base64.b64decode(pem.group(1)) if pem else b""
        (certificate,) = _der(der, (0, 0, len(der)))
        fields = _der(der, _der(der, certificate)[0])  # the "to be signed" part
        if fields[0][0] == 0xA0:
            fields = fields[1:]  # the explicit version
        algorithm, key = _der(der, fields[5])  # subjectPublicKeyInfo
        _, start, end = _der(der, algorithm)[0]
        if der[start:end] != _RSA_ENCRYPTION:
            return None
        _, start, end = key  # a bit string: its count of padding bits, then the RSA key
        modulus = _der(der, _der(der, (0, start + 1, end))[0])[0]
        return int.from_bytes(der[modulus[1] : modulus[2]], "big").bit_length()
    except (OSError, ValueError, IndexError):  # binascii.Error is a ValueError
        return None


def _der(der: bytes, within: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    """The DER elements inside the content of ``within``: (tag, content start, content end)
    of each."""
    _, start, end = within
    found = []
    while start < end:
        tag, length, start = der[start], der[start + 1], start + 2
        if length & 0x80:
            size = length & 0x7F
            length, start = int.from_bytes(der[start : start + size], "big"), start + size
        found.append((tag, start, start + length))
        start += length
    return found


__all__ = ["check_key_pair", "security_level_refusal", "server_credentials"]
