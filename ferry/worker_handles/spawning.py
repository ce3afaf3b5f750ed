"""Starting a Python module of Ferry's as a child process of the frontend: a worker, a
process hosting several models, the fork server."""

from __future__ import annotations

import asyncio
import socket
import sys


async def spawn_module(
    module: str, child_sock: socket.socket, env: dict[str, str], *args: str
) -> asyncio.subprocess.Process:
    """``python -P -m MODULE --fd N ARGS``, ``child_sock`` its end of the socket pair."""
    # -P: the frontend's working directory is not put on the worker's import path, so a
    # stray ``image_classifier.py`` there cannot replace a built-in handler.
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-P",
        "-m",
        module,
        "--fd",
        str(child_sock.fileno()),
        *args,
        pass_fds=(child_sock.fileno(),),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
