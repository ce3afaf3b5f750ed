"""Write model archives in torch-model-archiver's layout, so TorchServe reads them too.

``check_spec`` finds what would make a broken archive before anything is written;
``write_archive`` then writes it.
"""

from __future__ import annotations

import ast
import difflib
import io
import json
import shutil
import tarfile
import zipfile
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ferry import __version__
from ferry.config.model_config import load_model_config
from ferry.errors import ArchiveError
from ferry.store.archive import _MODEL_NAME
from ferry.store.manifest import MANIFEST_PATH, manifest_document

_SUFFIXES = {"default": ".mar", "zip-store": ".mar", "tgz": ".tar.gz", "no-archive": ""}
ARCHIVE_FORMATS = tuple(_SUFFIXES)
RUNTIMES = ("python", "python3")
_MODULE_BASES = {"nn.Module", "torch.nn.Module", "Module"}


@dataclass(frozen=True)
class ArchiveSpec:
    model_name: str
    handler: str
    """A built-in handler name, or a path to a handler .py file (optionally ``:function``)."""
    version: str = "1.0"
    serialized_file: Path | None = None
    model_file: Path | None = None
    config_file: Path | None = None
    extra_files: tuple[Path, ...] = field(default_factory=tuple)
    """Files, and folders whose contents (subfolders kept) go to the archive's root."""
    archive_format: str = "default"
    runtime: str = "python"
    requirements_file: Path | None = None
    """Copied to the archive's root and named by the manifest's ``model.requirementsFile``."""


def archive_target(spec: ArchiveSpec, export_path: Path) -> Path:
    """Where ``write_archive`` puts the archive (a folder for ``no-archive``)."""
    return export_path / f"{spec.model_name}{_SUFFIXES.get(spec.archive_format, '')}"


def check_spec(
    spec: ArchiveSpec, export_path: Path, *, builtin_handlers: Collection[str] = ()
) -> list[str]:
    """Raise ``ArchiveError`` for what would make an archive no server can load; return
    warnings for what torch-model-archiver allows but may be a mistake.

    ``builtin_handlers`` are the handler names a server provides, so that a misspelt one
    is caught here rather than when the model is loaded.
    """
    if not _MODEL_NAME.match(spec.model_name):
        raise ArchiveError(
            f"invalid model name {spec.model_name!r}: use letters, digits, '_', '-' and '.', "
            "starting with a letter or digit"
        )
    if spec.archive_format not in ARCHIVE_FORMATS:
        raise ArchiveError(f"archive format must be one of {', '.join(ARCHIVE_FORMATS)}")
    if spec.runtime not in RUNTIMES:
        raise ArchiveError(f"runtime must be one of {', '.join(RUNTIMES)}")
    if export_path.exists() and not export_path.is_dir():
        raise ArchiveError(f"export path {export_path} is not a folder")
    for _ in _files(spec):  # every named file exists
        pass
    warnings = _check_handler(spec, builtin_handlers)
    if spec.model_file is not None:
        _check_model_file(spec.model_file)
    if spec.config_file is not None:
        # ModelConfigError names an invalid key; a misspelt top-level one is a warning.
        warnings.extend(load_model_config(spec.config_file).warnings)
    if spec.serialized_file is None and spec.model_file is None:
        warnings.append(
            "no --serialized-file or --model-file: the handler must build or fetch its model"
        )
    return warnings


def _check_handler(spec: ArchiveSpec, builtin_handlers: Collection[str]) -> list[str]:
    module, _, _ = spec.handler.partition(":")
    if module.endswith(".py"):
        _compile(Path(module))
        return []
    # A module among the extra files (``my_handler.py`` or a package folder) is imported.
    provided = {Path(name).parts[0].removesuffix(".py") for name, _ in _files(spec)}
    if module in builtin_handlers or module in provided or not builtin_handlers:
        return []
    close = difflib.get_close_matches(module, builtin_handlers, n=1, cutoff=0.8)
    if close:
        raise ArchiveError(f"unknown handler {module!r}; did you mean {close[0]!r}?")
    return [
        f"handler {module!r} is neither a .py file nor a built-in "
        f"({', '.join(sorted(builtin_handlers))}): it must be importable where the model is served"
    ]


def _parse(path: Path) -> ast.Module:
    """``path`` parsed as Python; ``ArchiveError`` naming the line of a syntax error."""
    try:
        return ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as exc:
        raise ArchiveError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from exc
    except ValueError as exc:  # null bytes
        raise ArchiveError(f"{path}: not a Python source file ({exc})") from exc


def _compile(path: Path) -> None:
    compile(_parse(path), str(path), "exec")


def _check_model_file(path: Path) -> None:
    """An eager model file must define exactly one ``nn.Module`` class, since the loader
    instantiates that one. Classes deriving from a base imported from elsewhere
    (``class Net(ResNet)``) cannot be told apart here, so finding none is not an error."""
    found: list[str] = []
    for node in _parse(path).body:
        if isinstance(node, ast.ClassDef) and any(
            ast.unparse(base) in _MODULE_BASES or ast.unparse(base) in found for base in node.bases
        ):
            found.append(node.name)
    if len(found) > 1:
        raise ArchiveError(
            f"{path} defines {len(found)} nn.Module classes ({', '.join(found)}); "
            "a model file must define exactly one: move the others to an --extra-files module"
        )


def _handler_entry(handler: str) -> tuple[str, Path | None]:
    """The manifest's handler value and the file to copy, if the handler is a file."""
    module, sep, function = handler.partition(":")
    path = Path(module)
    if path.suffix == ".py":
        if not path.is_file():
            raise ArchiveError(f"handler file not found: {module}")
        return f"{path.name}{sep}{function}", path
    return handler, None


def _files(spec: ArchiveSpec) -> Iterator[tuple[str, Path]]:
    """(name in archive, source) pairs; extra folders are added with their contents."""
    _, handler_file = _handler_entry(spec.handler)
    singles = [
        spec.serialized_file,
        spec.model_file,
        spec.config_file,
        spec.requirements_file,
        handler_file,
    ]
    for source in singles:
        if source is not None:
            if not source.is_file():
                raise ArchiveError(f"file not found: {source}")
            yield source.name, source
    for extra in spec.extra_files:
        if extra.is_dir():
            for item in sorted(extra.rglob("*")):
                if item.is_file():
                    yield item.relative_to(extra).as_posix(), item
        elif extra.is_file():
            yield extra.name, extra
        else:
            raise ArchiveError(f"extra file not found: {extra}")


def _manifest_bytes(spec: ArchiveSpec) -> bytes:
    handler_value, _ = _handler_entry(spec.handler)
    manifest = manifest_document(
        model_name=spec.model_name,
        version=spec.version,
        handler=handler_value,
        serialized_file=spec.serialized_file.name if spec.serialized_file else None,
        model_file=spec.model_file.name if spec.model_file else None,
        config_file=spec.config_file.name if spec.config_file else None,
        created_on=datetime.now().strftime("%d/%m/%Y %H:%M:%S"),
        archiver_version=f"ferry-{__version__}",
    )
    manifest["runtime"] = spec.runtime
    if spec.requirements_file is not None:
        manifest["model"]["requirementsFile"] = spec.requirements_file.name
    return json.dumps(manifest, indent=2).encode()


def write_archive(spec: ArchiveSpec, export_path: Path, *, force: bool = False) -> Path:
    """Write the archive into ``export_path`` and return its path (run ``check_spec``
    first to catch broken inputs). An existing archive is replaced only with ``force``."""
    if spec.archive_format not in ARCHIVE_FORMATS:
        raise ArchiveError(f"archive format must be one of {', '.join(ARCHIVE_FORMATS)}")
    manifest_bytes = _manifest_bytes(spec)
    files = dict(_files(spec))  # a later duplicate name wins, as in torch-model-archiver
    target = archive_target(spec, export_path)
    if target.exists():
        if not force:
            raise ArchiveError(f"{target} already exists (use --force to overwrite)")
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink()
    export_path.mkdir(parents=True, exist_ok=True)
    if spec.archive_format in ("default", "zip-store"):
        stored = spec.archive_format == "zip-store"
        compression = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
        with zipfile.ZipFile(target, "w", compression) as zf:
            zf.writestr(MANIFEST_PATH.as_posix(), manifest_bytes)
            for name, source in files.items():
                zf.write(source, name)
    elif spec.archive_format == "tgz":
        with tarfile.open(target, "w:gz") as tf:
            info = tarfile.TarInfo(f"{spec.model_name}/{MANIFEST_PATH.as_posix()}")
            info.size = len(manifest_bytes)
            tf.addfile(info, io.BytesIO(manifest_bytes))
            for name, source in files.items():
                tf.add(source, f"{spec.model_name}/{name}")
    else:
        (target / "MAR-INF").mkdir(parents=True)
        (target / MANIFEST_PATH).write_bytes(manifest_bytes)
        for name, source in files.items():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target / name)
    return target
