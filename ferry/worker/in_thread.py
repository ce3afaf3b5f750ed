"""A worker's life on a thread of the frontend's own process (``ferry.worker_handles.
in_process`` starts it): the same exchange as a worker process (``main.serve``) over its
socket, with what a process would do once at its start done here per worker.

A load imports the model folder's modules and forgets them again (as a process hosting
several models does, ``host.loading_alone``), so a restarted worker imports its handler
afresh. A GPU context the handler broke is the whole process's: the process ends.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from ferry.wire.messages import DEVICE_FAILED_EXIT
from ferry.worker.host import loading_alone
from ferry.worker.inbox import Inbox
from ferry.worker.main import read_spec, serve
from ferry.worker.torch_setup import configure_torch

log = logging.getLogger("ferry.worker")


def run_worker(
    sock: socket.socket, on_exit: Callable[[int], None], end_process: Callable[[int], None]
) -> None:
    """Serve the worker on ``sock`` until the frontend closes it; ``on_exit`` gets its
    status (as a process's exit status), ``end_process`` is called for a broken GPU."""
    status = 1
    try:
        with sock:
            inbox = Inbox(sock)
            spec = read_spec(inbox)
            if spec is not None:
                configure_torch(spec.torch_threads)
                status = serve(sock, inbox, spec, loading=loading_alone(spec.model), unload=True)
    except OSError as error:  # the frontend let go first
        log.info("in-process worker let go: %s", error)
    except Exception:
        log.exception("in-process worker failed")
    finally:
        on_exit(status)
    if status == DEVICE_FAILED_EXIT:
        log.error("exiting: the GPU context is unusable; every model of this process goes")
        end_process(DEVICE_FAILED_EXIT)
