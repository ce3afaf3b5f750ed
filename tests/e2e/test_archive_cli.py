"""``ferry archive`` as a user runs it: torch-model-archiver's flags, every archive format
opened by Ferry, and broken inputs refused before anything is written."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from ferry.store.archive import open_model
from tests.fixtures.cli import run_ferry
from tests.fixtures.models import HANDLERS

pytestmark = pytest.mark.e2e

DIGEST = str(HANDLERS / "digest_handler.py")
ONE_MODULE = "import torch\nfrom torch import nn\n\n\nclass Net(nn.Module):\n    pass\n"
TWO_MODULES = ONE_MODULE + "\n\nclass Head(torch.nn.Module):\n    pass\n"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _inputs(tmp: Path) -> dict[str, Path]:
    """Every kind of file ``ferry archive`` takes, written under ``tmp/in``."""
    src = tmp / "in"
    return {
        "weights": _write(src / "weights.pt", "not really weights"),
        "model": _write(src / "model.py", ONE_MODULE),
        "config": _write(src / "model-config.yaml", "batchSize: 4\nmaxBatchDelay: 20\n"),
        "requirements": _write(src / "requirements.txt", "numpy\n"),
        "labels": _write(src / "index_to_name.json", '{"0": "cat"}'),
        "assets": _write(src / "assets" / "vocab" / "words.txt", "a\nb\n").parents[1],
    }


def _full_args(tmp: Path, archive_format: str) -> list[str]:
    files = _inputs(tmp)
    return [
        "archive",
        "--model-name",
        "full",
        "-v",
        "2.5",
        "--handler",
        DIGEST,
        "--serialized-file",
        str(files["weights"]),
        "--model-file",
        str(files["model"]),
        "--extra-files",
        f"{files['labels']},{files['assets']}",
        "--runtime",
        "python3",
        "-r",
        str(files["requirements"]),
        "-c",
        str(files["config"]),
        "--archive-format",
        archive_format,
        "--export-path",
        str(tmp / "store"),
    ]


@pytest.mark.parametrize(
    ("archive_format", "file_name"),
    [
        ("default", "full.mar"),
        ("zip-store", "full.mar"),
        ("tgz", "full.tar.gz"),
        ("no-archive", "full"),
    ],
)
def test_every_flag_in_every_format_opens_in_ferry(
    tmp_path: Path, archive_format: str, file_name: str
) -> None:
    made = run_ferry(*_full_args(tmp_path, archive_format))
    assert made.returncode == 0, made.stderr
    assert made.stderr == ""
    assert Path(made.stdout.strip()) == tmp_path / "store" / file_name
    (tmp_path / "work").mkdir()
    archive = open_model(tmp_path / "store", file_name, tmp_path / "work")
    assert (archive.name, archive.version) == ("full", "2.5")
    assert archive.config.batch_size == 4
    document = archive.manifest.document
    assert document["runtime"] == "python3"
    assert document["model"]["requirementsFile"] == "requirements.txt"
    assert (archive.model_dir / "requirements.txt").read_text() == "numpy\n"
    assert archive.manifest.handler == "digest_handler.py"
    assert archive.manifest.serialized_file == "weights.pt"
    assert archive.manifest.model_file == "model.py"
    assert (archive.model_dir / "index_to_name.json").exists()
    assert (archive.model_dir / "vocab" / "words.txt").read_text() == "a\nb\n"
    archive.free()


@pytest.mark.parametrize(
    ("archive_format", "compression"),
    [("default", zipfile.ZIP_DEFLATED), ("zip-store", zipfile.ZIP_STORED)],
)
def test_zip_formats_compress_as_named(
    tmp_path: Path, archive_format: str, compression: int
) -> None:
    run_ferry(*_full_args(tmp_path, archive_format), check=True)
    with zipfile.ZipFile(tmp_path / "store" / "full.mar") as zf:
        assert {info.compress_type for info in zf.infolist()} == {compression}


def test_existing_archive_is_kept_without_force(tmp_path: Path) -> None:
    store = tmp_path / "store"
    weights = _write(tmp_path / "in" / "weights.pt", "w")
    base = ["archive", "--model-name", "m", "--handler", DIGEST, "--export-path", str(store)]
    base += ["--serialized-file", str(weights)]
    run_ferry(*base, check=True)
    target = store / "m.mar"
    target.write_bytes(b"older")
    refused = run_ferry(*base)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and str(target) in refused.stderr
    assert "--force" in refused.stderr and target.read_bytes() == b"older"
    assert run_ferry(*base, "-f").returncode == 0
    assert zipfile.is_zipfile(target)


def _misspelt_handler(tmp: Path) -> list[str]:
    return ["--handler", "image_clasifier"]


def _handler_syntax_error(tmp: Path) -> list[str]:
    return ["--handler", str(_write(tmp / "in" / "h.py", "def handle(data, context)\n"))]


def _invalid_yaml(tmp: Path) -> list[str]:
    return ["-c", str(_write(tmp / "in" / "model-config.yaml", "batchSize: [4\nx: {"))]


def _invalid_config_value(tmp: Path) -> list[str]:
    return ["--config-file", str(_write(tmp / "in" / "model-config.yaml", "batchSize: 0\n"))]


def _two_model_classes(tmp: Path) -> list[str]:
    return ["--model-file", str(_write(tmp / "in" / "model.py", TWO_MODULES))]


def _model_file_syntax_error(tmp: Path) -> list[str]:
    return ["--model-file", str(_write(tmp / "in" / "model.py", "class Net(nn.Module\n"))]


def _missing_weights(tmp: Path) -> list[str]:
    return ["--serialized-file", str(tmp / "in" / "absent.pt")]


def _missing_extra(tmp: Path) -> list[str]:
    return ["--extra-files", str(tmp / "in" / "absent.json")]


@pytest.mark.parametrize(
    ("extra", "model_name", "expected"),
    [
        (_misspelt_handler, "m", "did you mean 'image_classifier'?"),
        (_handler_syntax_error, "m", "h.py:1: syntax error"),
        (_invalid_yaml, "m", "cannot read model-config.yaml"),
        (_invalid_config_value, "m", "batchSize"),
        (_two_model_classes, "m", "2 nn.Module classes (Net, Head)"),
        (_model_file_syntax_error, "m", "model.py:1: syntax error"),
        (_missing_weights, "m", "file not found:"),
        (_missing_extra, "m", "extra file not found:"),
        (lambda tmp: [], "team/model", "invalid model name 'team/model'"),
        (lambda tmp: [], "-dash", "invalid model name '-dash'"),
    ],
)
def test_broken_inputs_exit_2_before_writing(
    tmp_path: Path,
    extra: Callable[[Path], list[str]],
    model_name: str,
    expected: str,
) -> None:
    store = tmp_path / "store"
    refused = run_ferry(
        "archive",
        f"--model-name={model_name}",
        "--handler",
        DIGEST,
        "--serialized-file",
        str(_write(tmp_path / "in" / "weights.pt", "w")),
        "--export-path",
        str(store),
        *extra(tmp_path),
    )
    assert refused.returncode == 2
    assert refused.stderr.startswith("ferry archive: error: ")
    assert refused.stderr.count("\n") == 1 and expected in refused.stderr
    assert "Traceback" not in refused.stderr and refused.stdout == ""
    assert not store.exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--handler", DIGEST], "no --serialized-file or --model-file"),
        (["--handler", "my_pkg.handler", "--model-file", "MODEL"], "'my_pkg.handler'"),
        (
            ["--handler", DIGEST, "--model-file", "MODEL", "-c", "CONFIG"],
            "model-config.yaml: unknown top-level key 'batchSzie' (did you mean 'batchSize'?)",
        ),
    ],
)
def test_allowed_but_doubtful_inputs_warn_and_write(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    files = {
        "MODEL": _write(tmp_path / "in" / "model.py", ONE_MODULE),
        "CONFIG": _write(tmp_path / "in" / "model-config.yaml", "batchSzie: 4\nmy_key: 1\n"),
    }
    args = [str(files[arg]) if arg in files else arg for arg in args]
    store = tmp_path / "store"
    made = run_ferry("archive", "--model-name", "m", "--export-path", str(store), *args)
    assert made.returncode == 0
    assert made.stderr.startswith("ferry archive: warning: ")
    assert made.stderr.count("\n") == 1 and expected in made.stderr
    assert (store / "m.mar").exists()


def test_handler_module_among_extra_files_needs_no_warning(tmp_path: Path) -> None:
    handler = _write(tmp_path / "in" / "my_handler.py", "def handle(data, context):\n    pass\n")
    made = run_ferry(
        "archive",
        "--model-name",
        "m",
        "--handler",
        "my_handler:handle",
        "--model-file",
        str(_write(tmp_path / "in" / "model.py", ONE_MODULE)),
        "--extra-files",
        str(handler),
        "--export-path",
        str(tmp_path / "store"),
    )
    assert made.returncode == 0 and made.stderr == ""
