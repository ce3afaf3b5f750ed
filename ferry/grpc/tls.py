"""The gRPC listeners' TLS credentials, checked before anything binds.

gRPC reports every problem with a certificate and key the same way: ``add_secure_port``
fails as if it could not bind (and logs "Invalid private key" to stderr). So the pair is
loaded here first with ``ssl`` (the standard library, no new dependency), and a file that
cannot be read, is not PEM, holds an encrypted key (gRPC takes no passphrase) or a key that
does not belong to the certificate stops start-up with a ``ConfigError`` that says which.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

from ferry.errors import ConfigError


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


__all__ = ["check_key_pair", "server_credentials"]
