"""What a container build needs to install Python packages the way pip does on this host.

A build's ``pip`` sees none of this host's pip configuration: its configuration files,
its environment variables, and the folders and files they point to (local wheel folders,
file:// indexes, a constraints file, a CA bundle). This writes one ``pip.conf`` holding the
host's effective settings, and prints the ``-v HOST:CONTAINER:ro`` mounts that put it at
``/etc/pip.conf`` and every path it names at the same place in the build.

    python3 scripts/pip_context.py OUT_DIR [--skip-find-links]

``--skip-find-links``: leave local wheel folders out (they may hold a torch build other
than the one the image asks for, which pip would prefer by its version label).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LIST_KEYS = {"find-links", "extra-index-url", "index-url", "trusted-host"}


def host_settings() -> dict[str, str]:
    """pip's effective settings here (``pip config list``: files, then environment)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    settings: dict[str, str] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        settings[name] = value.strip().strip("'\"")
    return settings


def paths_named(value: str) -> list[Path]:
    """The existing local paths a setting's value names (plain paths or file:// URLs)."""
    found = []
    for token in value.split():
        path = Path(token.removeprefix("file://"))
        if path.is_absolute() and path.exists():
            # A file:// index links its files relative to it (../../files/...): mount the
            # folder that holds the index, not only the index.
            found.append(path.parent if path.name == "simple" else path)
    return found


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    skip_find_links = "--skip-find-links" in argv
    settings = host_settings()
    if skip_find_links:
        settings.pop("find-links", None)
    out.mkdir(parents=True, exist_ok=True)
    conf = out / "pip.conf"
    conf.write_text("[global]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(settings.items())))
    mounts = {conf: Path("/etc/pip.conf")}
    for value in settings.values():
        for path in paths_named(value):
            mounts[path] = path
    for host, inside in mounts.items():
        print(f"-v={host}:{inside}:ro")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
