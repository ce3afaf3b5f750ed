"""``ferry sagemaker-serve``: Ferry as SageMaker starts a model container
(``docker run IMAGE serve``; the image's ``serve`` runs this).

Configured by the environment alone, as SageMaker configures containers: the
``SAGEMAKER_*`` variables become Ferry's settings (``ferry.config.sagemaker``), below the
``FERRY_*`` variables and above TorchServe's ``TS_*`` ones and ``TS_CONFIG_FILE``'s file.
Without ``SAGEMAKER_MULTI_MODEL=true`` it serves the model SageMaker unpacked into
``/opt/ml/model`` as ``model`` (``/invocations``, ``/ping``: 200 once it is loaded);
with it, no model until SageMaker loads them (``ferry.http.sagemaker_models``).
Exit codes are ``ferry serve``'s.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ferry.errors import ConfigError

log = logging.getLogger("ferry")


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "sagemaker-serve",
        help="serve as SageMaker's model container (the image's 'serve')",
        description="Serve as SageMaker starts a model container (docker run IMAGE serve), "
        "configured by the environment: SAGEMAKER_BIND_TO_PORT (8080, on 0.0.0.0), "
        "SAGEMAKER_MODEL_SERVER_WORKERS, SAGEMAKER_MODEL_SERVER_TIMEOUT, "
        "SAGEMAKER_MAX_PAYLOAD_IN_MB, SAGEMAKER_PROGRAM, SAGEMAKER_MULTI_MODEL ... "
        "(docs/sagemaker.md); FERRY_* variables override them. The model is "
        "$SAGEMAKER_BASE_DIR/model (/opt/ml/model).",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # Until the server installs its own handlers, SIGTERM interrupts start-up like Ctrl-C.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return _serve()
    except ConfigError as error:
        print(f"ferry sagemaker-serve: {error.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ferry sagemaker-serve: start-up interrupted", file=sys.stderr)
        return 1


def _serve() -> int:
    from ferry.cli.serve import run_loop
    from ferry.config.sagemaker import MODEL_NAME, check_code_is_local, sagemaker_start
    from ferry.config.sources import load_settings
    from ferry.http.listener import multi_model_inference_listener
    from ferry.logs import configure_logging
    from ferry.procinfo import memory_limit_bytes
    from ferry.server import LISTENERS, listeners_with, run_server

    start = sagemaker_start(os.environ, memory_limit_bytes())
    config_file = os.environ.get("TS_CONFIG_FILE")
    settings = load_settings(
        {}, start.environ(os.environ), Path(config_file).expanduser() if config_file else None
    )
    configure_logging(settings.log_format, settings.log_level, settings.log_location)
    for note in start.notes:
        log.warning("%s", note)
    if settings.model_store is None or not settings.model_store.is_dir():
        raise ConfigError(
            f"model store {settings.model_store} is not a folder (SAGEMAKER_BASE_DIR)"
        )
    if not start.multi_model:
        check_code_is_local(os.environ, settings.model_store / MODEL_NAME)
    specs = LISTENERS
    if start.multi_model:
        specs = listeners_with("inference", multi_model_inference_listener)
    log.info(
        "SageMaker %s endpoint: %s",
        "multi-model" if start.multi_model else "single-model",
        settings.inference_address.url(),
    )
    return run_loop(run_server(settings, specs))
