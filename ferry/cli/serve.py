"""``ferry serve``: TorchServe's start-up flags, Ferry's settings."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from ferry.config.settings import Address, ServerSettings
from ferry.errors import ConfigError


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("serve", help="start the model server")
    parser.add_argument("--model-store", type=Path, help="folder holding model archives")
    parser.add_argument(
        "--models", nargs="+", default=[], help="'all', or NAME=ARCHIVE entries to load at start-up"
    )
    parser.add_argument(
        "--inference-address",
        default="http://127.0.0.1:8080",
        help="listen address of the inference API (port 0: any free port)",
    )
    parser.add_argument(
        "--management-address",
        default="http://127.0.0.1:8081",
        help="listen address of the management API (port 0: any free port)",
    )
    parser.add_argument(
        "--enable-model-api",
        action="store_true",
        help="allow registering and unregistering models through the management API",
    )
    parser.add_argument(
        "--allowed-urls",
        default="",
        help="comma-separated regular expressions remote archive URLs must match (default: none)",
    )
    parser.add_argument("--workers", type=int, default=0, help="workers per model (0: derive)")
    parser.add_argument("--job-queue-size", type=int, default=100)
    parser.add_argument("--max-request-size", type=int, default=6_553_500)
    parser.add_argument("--default-response-timeout", type=float, default=120.0)
    parser.add_argument("--ready-file", type=Path, help="write bound addresses here when ready")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    # TorchServe flags accepted for drop-in scripts: Ferry always runs in the foreground
    # and keeps no config snapshots.
    parser.add_argument("--foreground", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--ncs", "--no-config-snapshots", action="store_true", help=argparse.SUPPRESS
    )
    parser.set_defaults(run=run)


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    for key in ("workers", "job_queue_size", "max_request_size"):
        if getattr(args, key) < (0 if key == "workers" else 1):
            raise ConfigError(f"--{key.replace('_', '-')} must be positive")
    return ServerSettings(
        model_store=args.model_store,
        models=tuple(args.models),
        inference_address=Address.parse(args.inference_address, key="--inference-address"),
        management_address=Address.parse(args.management_address, key="--management-address"),
        enable_model_api=args.enable_model_api,
        allowed_urls=tuple(url for url in args.allowed_urls.split(",") if url),
        default_workers_per_model=args.workers,
        job_queue_size=args.job_queue_size,
        max_request_size=args.max_request_size,
        default_response_timeout=args.default_response_timeout,
        ready_file=args.ready_file,
        log_level=args.log_level,
    )


def _run_loop(coroutine: Any) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)  # type: ignore[no-any-return]
    return uvloop.run(coroutine)  # type: ignore[no-any-return]


def run(args: argparse.Namespace) -> int:
    from ferry.http.server import run_server

    try:
        settings = settings_from_args(args)
    except ConfigError as error:
        print(f"ferry serve: {error.message}", file=sys.stderr)
        return 2
    if settings.model_store is not None and not settings.model_store.is_dir():
        print(f"ferry serve: model store {settings.model_store} is not a folder", file=sys.stderr)
        return 2
    return _run_loop(run_server(settings))
