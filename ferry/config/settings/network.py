"""Settings of the listeners and who may call them: addresses and TLS, gRPC, security.

Each field is one setting, declared once (``ferry.config.settings.declare``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ferry.config import values as v
from ferry.config.settings.declare import setting
from ferry.config.value_types import Address

_LISTENER = (
    "`http(s)://HOST:PORT` or `unix:/PATH`; port 0 picks a free one; `https://` needs "
    "`certificate_file` and `private_key_file`."
)
_SECURITY = ("Security", "security.md")


@dataclass(frozen=True)
class AddressSettings:
    """Where the three HTTP APIs listen, and the TLS files of those that need them."""

    inference_address: Address = setting(
        Address("127.0.0.1", 8080), v.ADDRESS, "Where the inference API listens: " + _LISTENER
    )
    management_address: Address = setting(
        Address("127.0.0.1", 8081),
        v.ADDRESS,
        "Where the management API listens (written as `inference_address`).",
    )
    metrics_address: Address = setting(
        Address("127.0.0.1", 8082),
        v.ADDRESS,
        "Where the Prometheus metrics are served (written as `inference_address`).",
    )
    certificate_file: Path | None = setting(
        None,
        v.PATH,
        "TLS certificate (PEM) for `https://` addresses and gRPC over TLS.",
        default_note="none",
    )
    private_key_file: Path | None = setting(
        None,
        v.PATH,
        "TLS private key (PEM) for `https://` addresses and gRPC over TLS.",
        default_note="none",
    )


@dataclass(frozen=True)
class GrpcSettings:
    """TorchServe's gRPC APIs (``ferry.grpc``): whether they start, and where."""

    enable_grpc: bool | None = setting(
        None,
        v.BOOLEAN,
        "TorchServe's gRPC inference and management APIs: true requires them, false turns "
        "them off. Any other `grpc_*` setting asks for them too.",
        default_note="on when grpcio (the `grpc` extra) is installed",
    )
    """Unset: on when grpcio is installed, as TorchServe always starts them."""
    grpc_inference_address: str | None = setting(
        None,
        v.HOST,
        "Host the gRPC inference API binds (the port is `grpc_inference_port`).",
        default_note="127.0.0.1",
    )
    grpc_inference_port: int | None = setting(
        None, v.PORT, "Port of the gRPC inference API; 0 picks a free one.", default_note="7070"
    )
    grpc_management_address: str | None = setting(
        None,
        v.HOST,
        "Host the gRPC management API binds (the port is `grpc_management_port`).",
        default_note="127.0.0.1",
    )
    grpc_management_port: int | None = setting(
        None, v.PORT, "Port of the gRPC management API; 0 picks a free one.", default_note="7071"
    )
    enable_grpc_ssl: bool = setting(
        False,
        v.BOOLEAN,
        "Serve both gRPC APIs over TLS with `certificate_file` and `private_key_file`.",
    )

    @property
    def grpc_inference_endpoint(self) -> Address:
        """Where the gRPC inference API listens (``grpc://`` or, with TLS, ``grpcs://``)."""
        host = self.grpc_inference_address or "127.0.0.1"
        port = 7070 if self.grpc_inference_port is None else self.grpc_inference_port
        return Address(host, port, "grpcs" if self.enable_grpc_ssl else "grpc")

    @property
    def grpc_management_endpoint(self) -> Address:
        """Where the gRPC management API listens."""
        host = self.grpc_management_address or "127.0.0.1"
        port = 7071 if self.grpc_management_port is None else self.grpc_management_port
        return Address(host, port, "grpcs" if self.enable_grpc_ssl else "grpc")

    @property
    def grpc_requested(self) -> bool:
        """Whether a setting asks for the gRPC APIs, so that they must start."""
        return bool(self.enable_grpc) or any(
            value is not None
            for value in (
                self.grpc_inference_address,
                self.grpc_inference_port,
                self.grpc_management_address,
                self.grpc_management_port,
            )
        )


@dataclass(frozen=True)
class SecuritySettings:
    """Who may call the APIs: token authorization, what the management API allows, CORS."""

    disable_token_authorization: bool = setting(
        False,
        v.BOOLEAN,
        "Turn token authorization off (it is on for management, and for inference beyond "
        "loopback).",
        flag="--disable-token-auth",
        see=_SECURITY,
    )
    key_file: Path = setting(
        Path("key_file.json"),
        v.PATH,
        "Where the API keys are kept, readable by the owner only: reused when it exists, "
        "written once every listener is bound when it does not.",
        see=_SECURITY,
    )
    management_key: str | None = setting(
        None,
        v.API_KEY,
        "A stable management API key (visible ASCII, no spaces).",
        default_note="the key file's, or a new one written there",
        see=_SECURITY,
        repr=False,
    )
    inference_key: str | None = setting(
        None,
        v.API_KEY,
        "A stable inference API key (visible ASCII, no spaces).",
        default_note="the key file's, or a new one written there",
        see=_SECURITY,
        repr=False,
    )
    enable_model_api: bool = setting(
        False,
        v.BOOLEAN,
        "Allow registering and unregistering models through the management API (405 otherwise).",
    )
    allowed_urls: tuple[str, ...] = setting(
        (), v.LIST, "Regular expressions a remote archive URL must match in full."
    )
    cors_allowed_origin: tuple[str, ...] = setting(
        (),
        v.LIST,
        "Origins (`*` for any) whose browser pages may call every API; none turns CORS off.",
    )
    cors_allowed_methods: tuple[str, ...] = setting(
        (),
        v.LIST,
        "Methods a CORS preflight may ask for (TorchServe: `GET, POST, PUT, OPTIONS`); none "
        "refuses every preflight.",
    )
    cors_allowed_headers: tuple[str, ...] = setting(
        (), v.LIST, "Request headers a CORS preflight may ask for (`*` for any)."
    )
    enable_envvars_config: bool = setting(
        False,
        v.BOOLEAN,
        "Also read TorchServe's `TS_*` environment variables (below `FERRY_*` ones).",
    )
