"""Where pip may fetch an archive's packages from (``pip_index_url``, ``pip_find_links``).

``allowed_urls`` guards the archives the server downloads, not pip: an archive's
requirements file can name its own index (``--index-url``, ``--extra-index-url``), a
folder or page of links (``-f``), a trusted host, a URL or a VCS repository
(``git+https://...``), and pip fetches from there. Unrestricted is TorchServe's way and
the default. When either setting is given, pip gets it on its command line and a
requirements file that could take pip anywhere else is refused before pip runs, naming
the line. The check allows what cannot reach a host by itself:

- named requirements (``torch==2.3``, ``pillow[extra]>=10; python_version > "3.9"``),
  fetched from the configured sources;
- files and folders inside the model's folder (``./wheels/dep.whl``);
- ``-r`` / ``-c`` files inside the model's folder, which are checked the same way;
- ``--hash``, ``--pre``, ``--prefer-binary``, ``--only-binary``, ``--no-binary`` and
  ``--require-hashes``.

Everything else is refused: every other option (pip's own abbreviations of the allowed
ones too), URLs, ``name @ url``, ``-e``, and ``${VARIABLE}`` references (pip expands them
before it reads options). Lines are split as pip splits them (its comment and
continuation rules), so the check reads what pip will read. pip's own configuration
(``pip.conf``, ``PIP_*`` variables) is the operator's, and still applies.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from ferry.errors import PackageInstallFailed

_COMMENT = re.compile(r"(^|\s+)#.*$")
"""pip's own comment rule (``pip._internal.req.req_file.COMMENT_RE``)."""
_SCHEME = re.compile(r"^(http|https|file):", re.IGNORECASE)
"""What pip takes for a URL in a ``-r`` / ``-c`` value."""
_SPECIFIER = r"(?:===|==|!=|<=|>=|~=|<|>)\s*[A-Za-z0-9.*+!_-]+"
_EXTRAS = r"(?:\[[A-Za-z0-9._,\s-]*\])?"
_NAMED = re.compile(
    r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?\s*"
    + _EXTRAS
    + rf"\s*(?:\(?\s*{_SPECIFIER}(?:\s*,\s*{_SPECIFIER})*\s*\)?)?\s*$"
)
"""A PEP 508 requirement by name, with extras and versions but no URL."""
_LOCAL = re.compile(r"^[A-Za-z0-9._/-]+" + _EXTRAS + r"$")
"""A file or folder named by a relative or absolute path (checked to be in the model)."""
_FLAGS = frozenset({"--pre", "--prefer-binary", "--require-hashes"})
_WITH_VALUE = frozenset({"--hash", "--only-binary", "--no-binary"})
_INCLUDES = {"-r": "-r", "--requirement": "-r", "-c": "-c", "--constraint": "-c"}


@dataclass(frozen=True)
class PipSources:
    """The settings ``pip_index_url`` and ``pip_find_links``; neither set: unrestricted."""

    index_url: str | None = None
    find_links: Path | None = None

    @property
    def restricted(self) -> bool:
        return self.index_url is not None or self.find_links is not None

    def options(self) -> list[str]:
        """pip's options for these sources (none when unrestricted).

        >>> PipSources(find_links=Path("/srv/wheels")).options()
        ['--no-index', '--find-links', '/srv/wheels']
        """
        options = ["--index-url", self.index_url] if self.index_url else []
        if self.find_links is not None:
            if not self.index_url:
                options.append("--no-index")
            # Absolute here, in the server: pip runs in the model's folder.
            options += ["--find-links", str(self.find_links.absolute())]
        return options

    def describe(self) -> str:
        where = [f"the index {self.index_url}"] if self.index_url else []
        if self.find_links is not None:
            where.append(f"the folder {self.find_links.absolute()}")
        return " and ".join(where)


UNRESTRICTED = PipSources()
"""Neither setting: TorchServe's way, the default."""


def startup_warning(sources: PipSources) -> str:
    """What the server logs at start-up when ``install_py_dep_per_model`` is on."""
    if sources.restricted:
        return (
            "install_py_dep_per_model is on: each archive's requirements file is installed "
            f"with pip, from {sources.describe()} only (pip_index_url / pip_find_links; "
            "allowed_urls does not apply to pip); pip runs the code of what it installs"
        )
    return (
        "install_py_dep_per_model is on: each archive's requirements file is installed with "
        "pip, which allowed_urls does not restrict: the file can send pip to any index, URL "
        "or repository. Set pip_index_url or pip_find_links to hold pip to your own sources"
    )


def check_requirements(model: str, model_dir: Path, requirements: Path) -> None:
    """Refuse (``PackageInstallFailed``) a requirements file, or one it includes, that could
    send pip beyond the configured sources (see the module docstring)."""
    _check_file(model, model_dir.resolve(), requirements, set())


def _check_file(model: str, root: Path, path: Path, seen: set[Path]) -> None:
    """``path`` as pip names it: an included file is joined to its includer's folder."""
    resolved = path.resolve()
    if resolved in seen:
        return
    seen.add(resolved)
    try:
        # utf-8-sig: pip drops a byte-order mark too.
        text = resolved.read_bytes().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise PackageInstallFailed(f"model {model}: cannot read {path.name}: {exc}") from exc
    for number, line in _logical_lines(text):
        where = f"model {model}: {path.name} line {number}"
        for include in _check_line(where, root, line):
            nested = path.parent / include
            _inside(where, root, nested, include)
            _check_file(model, root, nested, seen)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """pip's lines: ``\\`` continuations joined (not after a comment), comments removed,
    blank lines dropped (``pip._internal.req.req_file``'s join_lines, ignore_comments)."""
    joined: list[tuple[int, str]] = []
    pending: list[str] = []
    first = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if line.endswith("\\") and not _COMMENT.match(line):
            first = first if pending else number
            pending.append(line.strip("\\"))
            continue
        if _COMMENT.match(line):
            line = " " + line
        joined.append((first, "".join([*pending, line])) if pending else (number, line))
        pending = []
    if pending:
        joined.append((first, "".join(pending)))
    stripped = ((number, _COMMENT.sub("", line).strip()) for number, line in joined)
    return [(number, line) for number, line in stripped if line]


def _check_line(where: str, root: Path, line: str) -> list[str]:
    """Refuse what the line must not carry; the ``-r`` / ``-c`` files it includes."""
    if "${" in line:
        raise _refused(where, "an environment variable reference (${...})")
    # pip's split: the requirement runs up to the first word starting with "-".
    words = line.split(" ")
    start = next((i for i, word in enumerate(words) if word.startswith("-")), len(words))
    requirement, options = " ".join(words[:start]).strip(), " ".join(words[start:])
    if requirement:
        _check_requirement(where, root, requirement)
    try:
        tokens = shlex.split(options)
    except ValueError as exc:
        raise _refused(where, f"options pip cannot read ({exc})") from exc
    return _check_options(where, tokens)


def _check_requirement(where: str, root: Path, requirement: str) -> None:
    name = requirement.split(";", 1)[0].strip()
    if "://" in requirement or "@" in name:
        raise _refused(where, f"the URL requirement {requirement!r}")
    if _NAMED.match(name):
        return
    if not _LOCAL.match(name) or ":" in name:
        raise _refused(where, f"the requirement {requirement!r}")
    # pip resolves a requirement's path from its working folder: the model's.
    _inside(where, root, root / re.sub(r"\[.*\]$", "", name), name)


def _check_options(where: str, tokens: list[str]) -> list[str]:
    includes = []
    index = 0
    while index < len(tokens):
        name, value = _option(where, tokens[index])
        index += 1
        if name in _FLAGS and value is None:
            continue
        if name not in _WITH_VALUE and name not in _INCLUDES:
            raise _refused(where, f"the option {name}")
        if value is None:
            if index == len(tokens):
                raise _refused(where, f"{name} without a value")
            value = tokens[index]
            index += 1
        if name in _INCLUDES:
            if _SCHEME.match(value) or "://" in value:
                raise _refused(where, f"{_INCLUDES[name]} {value} (a URL)")
            includes.append(value)
    return includes


def _option(where: str, token: str) -> tuple[str, str | None]:
    """An option's name and the value written into the same word (``--hash=...``,
    ``-rfile.txt``), as optparse reads them; None when there is none."""
    if token.startswith("--"):
        name, equals, value = token.partition("=")
        return name, value if equals else None
    if token.startswith("-"):
        return token[:2], token[2:] or None
    raise _refused(where, f"the word {token!r} among the options")


def _inside(where: str, root: Path, path: Path, named: str) -> Path:
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise _refused(where, f"{named!r}, which is outside the model's folder")
    return resolved


def _refused(where: str, what: str) -> PackageInstallFailed:
    return PackageInstallFailed(
        f"{where}: {what} is refused: pip_index_url / pip_find_links restrict where pip "
        "installs from, and the archive cannot change that"
    )
