"""Resource limits: archives unpack to at most ``max_unpacked_size`` and are freed when their
version goes; stale work folders are swept; images are judged from their header before a
pixel is decoded; the server's workers stay within ``max_workers_total``."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image, ImageFile

from ferry.capacity.sizing import (
    SHARED_GROUP,
    WORKER_LIMIT_FIX,
    ProcessUse,
    over_worker_limit,
    process_count,
    process_group_for,
)
from ferry.config.image_limits import ImageLimits
from ferry.config.model_config import ModelConfig
from ferry.config.settings import ServerSettings, default_max_workers_total
from ferry.config.sources import load_settings
from ferry.errors import ArchiveError, ConfigError, InvalidInput, InvalidRequest, ModelLoadFailed
from ferry.handlers.builtin.image_classifier import ImageClassifier
from ferry.handlers.builtin.vision import ImageTransform
from ferry.handlers.contract.context import Context
from ferry.service import FerryService
from ferry.service.types import RegisterRequest
from ferry.store import ArchiveSpec, open_model, write_archive
from ferry.store.extract import extract_tar, extract_zip
from ferry.store.workdir import open_work_dir, sweep_stale
from ferry.wire import codec
from ferry.wire.messages import StartWorker
from tests.fixtures.fake_worker import FakeFactory, load_error
from tests.fixtures.handler_inputs import bomb_png
from tests.fixtures.models import digest_archive

BOMB_MESSAGE = (
    "image of 12000x12000 = 144000000 pixels exceeds the limit of 40000000 (limit_max_image_pixels)"
)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


@pytest.fixture(autouse=True)
def private_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The services of these tests keep their work folders under ``tmp_path``."""
    root = tmp_path / "tmpdir"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


# --- unpacking: the size cap ------------------------------------------------------------


def _zip(path: Path, entries: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return path


def _tar(path: Path, entries: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _bytes_under(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


BOMB_ENTRIES = {f"part{i}.bin": bytes(400_000) for i in range(3)}  # 1.2 MB of zeros


@pytest.mark.parametrize("write, extract", [(_zip, extract_zip), (_tar, extract_tar)])
def test_an_archive_unpacking_past_the_cap_is_refused(
    tmp_path: Path, write: Callable[..., Path], extract: Callable[..., None]
) -> None:
    archive = write(tmp_path / "model.mar", BOMB_ENTRIES)
    assert archive.stat().st_size < 20_000  # small on disk, 1.2 MB unpacked
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(ArchiveError) as refused:
        extract(archive, dest, 1 << 20)
    assert (
        refused.value.message == "model.mar unpacks to more than 1 MiB (max_unpacked_size); refused"
    )
    assert _bytes_under(dest) == 0  # refused from the declared sizes, before writing


@pytest.mark.parametrize("write, extract", [(_zip, extract_zip), (_tar, extract_tar)])
def test_the_bytes_written_are_counted_whatever_the_archive_declares(
    tmp_path: Path,
    write: Callable[..., Path],
    extract: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An archive whose declared sizes pass the check still stops at the cap."""
    monkeypatch.setattr("ferry.store.extract._Budget.check_declared", lambda self, sizes: None)
    archive = write(tmp_path / "model.mar", BOMB_ENTRIES)
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(ArchiveError, match=r"unpacks to more than 1000000 bytes"):
        extract(archive, dest, 1_000_000)
    assert _bytes_under(dest) <= 1_000_000


def test_an_archive_within_the_cap_unpacks(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "model.mar", BOMB_ENTRIES)
    dest = tmp_path / "dest"
    dest.mkdir()
    extract_zip(archive, dest, 1_200_000)
    assert _bytes_under(dest) == 1_200_000


def test_a_refused_archive_leaves_nothing_in_the_work_folder(tmp_path: Path) -> None:
    store, work = tmp_path / "store", tmp_path / "work"
    store.mkdir()
    work.mkdir()
    digest_archive(store, "digest")
    with pytest.raises(ArchiveError, match=r"digest.mar unpacks to more than 100 bytes"):
        open_model(store, "digest.mar", work, max_unpacked_size=100)
    _zip(store / "junk.mar", {"no-manifest.txt": b"x"})
    with pytest.raises(ArchiveError):
        open_model(store, "junk.mar", work)
    assert list(work.iterdir()) == []


# --- unpacking: freeing -----------------------------------------------------------------


def _spec(tmp: Path, archive_format: str) -> ArchiveSpec:
    handler = tmp / "my_handler.py"
    handler.write_text("def handle(data, context):\n    return data\n")
    return ArchiveSpec("m1", str(handler), archive_format=archive_format)


@pytest.mark.parametrize("archive_format", ["default", "tgz"])
def test_an_unpacked_archive_is_freed_whole(tmp_path: Path, archive_format: str) -> None:
    store, work = tmp_path / "store", tmp_path / "work"
    work.mkdir()
    target = write_archive(_spec(tmp_path, archive_format), store)
    archive = open_model(store, target.name, work)
    assert archive.unpacked is not None and archive.model_dir.is_relative_to(archive.unpacked)
    assert archive.unpacked.parent == work
    archive.free()
    assert list(work.iterdir()) == []


def test_a_model_folder_in_the_store_is_never_deleted(tmp_path: Path) -> None:
    store, work = tmp_path / "store", tmp_path / "work"
    work.mkdir()
    folder = write_archive(_spec(tmp_path, "no-archive"), store)
    archive = open_model(store, folder.name, work)
    assert archive.unpacked is None and archive.model_dir == folder
    archive.free()
    assert (folder / "my_handler.py").exists()


@pytest.fixture
def store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    store.mkdir()
    digest_archive(store, "good", minWorkers=1)
    digest_archive(store, "many", minWorkers=6)
    return store


def _service(store: Path, factory: FakeFactory | None = None, **settings: Any) -> FerryService:
    values: dict[str, Any] = {"model_store": store, "enable_model_api": True, **settings}
    return FerryService(ServerSettings(**values), start_worker=factory or FakeFactory())


def _unpacked(service: FerryService) -> list[Path]:
    """The archives unpacked in the work folder (each model's compile cache aside)."""
    return [p for p in service.models.work_dir.iterdir() if "-compile-cache-" not in p.name]


def test_unregistering_frees_the_unpacked_folder(store: Path) -> None:
    async def scenario() -> None:
        service = _service(store)
        for _ in range(3):
            await service.register(RegisterRequest(url="good.mar", synchronous=True))
            assert len(_unpacked(service)) == 1
            await service.unregister("good", None)
            assert list(service.models.work_dir.iterdir()) == []  # its compile cache too
        await service.close()

    run(scenario)


def test_a_rolled_back_registration_frees_its_folder(store: Path) -> None:
    async def scenario() -> None:
        service = _service(store, FakeFactory(load_error()))
        request = RegisterRequest(url="good.mar", initial_workers=1, synchronous=True)
        with pytest.raises(ModelLoadFailed):
            await service.register(request)
        assert _unpacked(service) == []
        await service.close()

    run(scenario)


def test_closing_frees_every_folder_and_the_work_folder(store: Path) -> None:
    async def scenario() -> None:
        service = _service(store, models=("good=good.mar",))
        await service.load_startup_models()
        work = service.models.work_dir
        (unpacked,) = _unpacked(service)
        await service.close()
        assert not unpacked.exists() and not work.exists()

    run(scenario)


# --- work folders left by killed servers ------------------------------------------------


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(child.stdout)


def test_the_folders_of_dead_servers_are_swept_and_live_ones_kept(
    tmp_path: Path, dead_pid: int
) -> None:
    root = tmp_path / "ferry-root"
    dead = root / f"{dead_pid}-abc123"
    mine = root / f"{os.getpid()}-def456"
    other = root / "notes"
    for folder in (dead, mine, other):
        (folder / "model-x").mkdir(parents=True)
    assert sweep_stale(root) == [dead]
    assert not dead.exists() and mine.exists() and other.exists()


def test_a_server_works_in_a_private_folder_named_by_its_pid(
    private_tmpdir: Path, dead_pid: int
) -> None:
    first = open_work_dir()
    try:
        folder = Path(first.name)
        root = private_tmpdir / f"ferry-{os.getuid()}"
        assert folder.parent == root and folder.name.startswith(f"{os.getpid()}-")
        assert root.stat().st_mode & 0o777 == 0o700
        stale = root / f"{dead_pid}-old"
        stale.mkdir()
        open_work_dir().cleanup()  # a second server starting
        assert not stale.exists() and folder.exists()
    finally:
        first.cleanup()


def test_a_shared_root_is_neither_used_nor_swept(tmp_path: Path, dead_pid: int) -> None:
    root = tmp_path / "shared"
    stale = root / f"{dead_pid}-old"
    stale.mkdir(parents=True)
    root.chmod(0o777)
    work = open_work_dir(root)
    assert not Path(work.name).is_relative_to(root) and stale.exists()
    work.cleanup()


# --- images: judged from the header -----------------------------------------------------


@pytest.fixture
def no_decoding(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Records every attempt to decode the pixels of an image file (and makes it fail)."""
    loads: list[object] = []

    def spy(image: object) -> None:
        loads.append(image)
        raise AssertionError("pixels decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", spy)  # what decodes an opened file
    return loads


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_an_image_over_the_pixel_limit_is_refused_before_decoding(
    no_decoding: list[object],
) -> None:
    bomb = bomb_png(12000, 12000)
    assert len(bomb) < 50_000
    with pytest.raises(InvalidInput) as refused:
        ImageTransform().decode(bomb)
    assert refused.value.message == BOMB_MESSAGE
    assert no_decoding == []


def _encoded(image_format: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (10, 200, 30)).save(buffer, format=image_format)
    return buffer.getvalue()


@pytest.mark.parametrize("image_format", ["GIF", "BMP", "TIFF", "WEBP"])
def test_formats_outside_the_list_are_refused_before_decoding(
    image_format: str, no_decoding: list[object]
) -> None:
    with pytest.raises(InvalidInput) as refused:
        ImageTransform().decode(_encoded(image_format))
    assert refused.value.message == (
        f"image format {image_format} is not allowed (allowed_image_formats: JPEG, PNG)"
    )
    assert no_decoding == []


def test_the_limits_are_settings() -> None:
    both = ImageTransform(limits=ImageLimits(max_pixels=None, formats=("GIF", "PNG")))
    assert both.decode(_encoded("GIF")).size == (40, 30)
    assert both.decode(bomb_png(2000, 1000)).size == (2000, 1000)
    small = ImageTransform(limits=ImageLimits(max_pixels=1000))
    with pytest.raises(InvalidInput, match=r"40x30 = 1200 pixels exceeds the limit of 1000"):
        small.decode(_encoded("PNG"))
    assert ImageTransform().decode(_encoded("JPEG")).size == (40, 30)


def _jpeg_claiming(width: int, hseven: int) -> bytes:
    """A small JPEG whose header (SOF0) claims ``width`` x ``hseven``."""
    data = bytearray(_encoded("JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = hseven.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(data)


def test_vision_handlers_take_the_limits_from_their_context_gpu_decoding_too(
    tmp_path: Path,
) -> None:
    limits = ImageLimits(max_pixels=10_000_000)
    handler = ImageClassifier()
    config = {"image_classifier": {"resize": 32, "crop": 28}}
    handler.initialize(
        Context(
            "m",
            str(tmp_path),
            {"model": {}},
            4,
            None,
            model_yaml_config=config,
            image_limits=limits,
        )
    )
    assert handler.transform.limits == limits
    gpu_calls: list[int] = []

    def gpu_decoder(images: list[bytes]) -> list[torch.Tensor]:
        gpu_calls.append(len(images))
        return [torch.zeros(3, 40, 30, dtype=torch.uint8) for _ in images]

    handler.jpeg_decoder = gpu_decoder
    batch = handler.preprocess([{"body": _jpeg_claiming(5000, 5000)}, {"body": _encoded("JPEG")}])
    assert batch is not None and batch.shape[0] == 1 and gpu_calls == [1]
    assert "5000x5000 = 25000000 pixels exceeds the limit of 10000000" in str(handler.failures[0])


def test_the_limits_reach_the_worker_in_its_spec(store: Path) -> None:
    async def scenario() -> None:
        factory = FakeFactory()
        settings = {"limit_max_image_pixels": 1000, "allowed_image_formats": ("PNG",)}
        service = _service(store, factory, models=("good=good.mar",), **settings)
        await service.load_startup_models()
        (spec,) = factory.specs
        assert spec.model.image_limits == ImageLimits(1000, ("PNG",))
        frame = codec.encode(StartWorker(spec))
        assert codec.decode(frame[codec.FRAME_HEADER.size :]) == StartWorker(spec)
        await service.close()

    run(scenario)


def test_image_settings_read_torchserves_values() -> None:
    def image_settings(**flags: str) -> tuple[int | None, tuple[str, ...]]:
        settings = load_settings(flags, {}, None)
        return settings.limit_max_image_pixels, settings.allowed_image_formats

    assert image_settings() == (40_000_000, ("JPEG", "PNG"))
    assert image_settings(limit_max_image_pixels="true")[0] == 40_000_000
    assert image_settings(limit_max_image_pixels="false")[0] is None
    assert image_settings(limit_max_image_pixels="1000", allowed_image_formats="png, gif") == (
        1000,
        ("PNG", "GIF"),
    )
    with pytest.raises(ConfigError, match="limit_max_image_pixels"):
        load_settings({"limit_max_image_pixels": "lots"}, {}, None)


# --- workers: a cap on the total --------------------------------------------------------


def test_the_worker_limit_names_the_models_and_the_cap() -> None:
    assert over_worker_limit([ProcessUse("a v1.0", 3), ProcessUse("b v1.0", 5)], 8) is None
    uses = [ProcessUse("a v1.0", 3), ProcessUse("b v1.0", 6), ProcessUse("c v1.0", 0)]
    assert over_worker_limit(uses, 8) == (
        "9 worker processes in all (a v1.0: 3, b v1.0: 6) exceed the limit of 8 "
        "(max_workers_total); raise it (--max-workers-total, or max_workers_total in "
        "config.properties), give the models fewer workers (minWorkers in their "
        "model-config.yaml), or let them share processes (share_worker_processes=always in "
        "config.properties, or a processGroup in their model-config.yaml)"
    )
    assert default_max_workers_total(2) == 8 and default_max_workers_total(16) == 32


def test_a_process_group_counts_the_processes_of_its_busiest_model() -> None:
    uses = [ProcessUse("a v1", 1, "g"), ProcessUse("b v1", 3, "g"), ProcessUse("c v1", 2)]
    assert process_count(uses) == 5
    assert over_worker_limit(uses, 5) is None
    assert over_worker_limit(uses, 4) == (
        "5 worker processes in all (c v1: 2, process group g: 3 (a v1: 1, b v1: 3)) exceed "
        "the limit of 4 (max_workers_total)" + WORKER_LIMIT_FIX
    )


def test_auto_sharing_keeps_own_processes_while_they_fit() -> None:
    seven = [ProcessUse(f"m{i}", 1) for i in range(7)]
    assert process_group_for(ModelConfig(), "auto", seven, "new", 1, 8) == ""
    assert process_group_for(ModelConfig(), "auto", [*seven, ProcessUse("x", 1)], "new", 1, 8) == (
        SHARED_GROUP
    )
    assert process_group_for(ModelConfig(), "always", [], "new", 1, 8) == SHARED_GROUP
    assert process_group_for(ModelConfig(), "never", seven * 2, "new", 1, 8) == ""
    named = ModelConfig(process_group="vision")
    assert process_group_for(named, "never", [], "new", 1, 8) == "vision"


def test_start_up_over_the_worker_limit_is_a_config_error(store: Path) -> None:
    async def scenario() -> None:
        service = _service(store, models=("good=good.mar", "many=many.mar"), max_workers_total=4)
        with pytest.raises(ConfigError) as refused:
            await service.load_startup_models()
        assert refused.value.message.startswith(
            "6 worker processes in all (process group shared: 6 (many v1.0: 6, good v1.0: 1)) "
            "exceed the limit of 4 (max_workers_total); raise it"
        )
        await service.close()

    run(scenario)


def test_registration_and_scaling_past_the_worker_limit_are_refused(store: Path) -> None:
    async def scenario() -> None:
        service = _service(store, models=("good=good.mar",), max_workers_total=4)
        await service.load_startup_models()
        with pytest.raises(ConfigError, match=r"limit of 4 \(max_workers_total\)"):
            await service.register(RegisterRequest(url="many.mar"))
        assert [p.name.partition("-")[0] for p in _unpacked(service)] == ["good"]
        with pytest.raises(
            InvalidRequest, match=r"10000 worker processes in all \(good v1.0: 10000\)"
        ):
            await service.scale("good", None, 10000, 10000, synchronous=False)
        scaled = await service.scale("good", None, 4, 4, synchronous=True)
        assert scaled.workers == 4
        assert (await service.scale("good", None, 0, 0, synchronous=True)).workers == 0
        await service.close()

    run(scenario)
