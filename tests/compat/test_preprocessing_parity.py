"""The built-in vision handlers hand the model what TorchServe's do: the same images
through Ferry's ``image_classifier`` and ``image_segmenter`` and through TorchServe's own
handlers (torchvision's ``Resize(256)``, ``CenterCrop(224)``, ``ToTensor``, ``Normalize``),
bit for bit, on JPEGs and PNGs of several sizes and aspect ratios. Ferry's faster decoding
(``draft_decode``) is an opt-in and measurably different."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.common import detailed_photo
from ferry.handlers.builtin.image_classifier import ImageClassifier
from ferry.handlers.builtin.vision_tasks import ImageSegmenter
from ferry.handlers.contract.context import Context
from tests.fixtures.torchvision_reference import torchserve_preprocess, torchvision_folder

pytestmark = pytest.mark.skipif(
    torchvision_folder() is None,
    reason="needs TorchServe 0.12 with torchvision's transforms: make torchserve-venv",
)

SIZES = [(720, 720), (1000, 667), (667, 1000), (1920, 1080), (500, 375), (300, 200), (257, 256)]
"""Width, height: squares, landscapes and portraits, large (draft-decodable) and small."""


IMAGES = [
    detailed_photo(width, height, seed, fmt)
    for seed, (width, height) in enumerate(SIZES)
    for fmt in ("JPEG", "PNG")
]


def _ferry_inputs(
    handler: ImageClassifier, images: list[bytes], tmp: Path, **section: object
) -> list[torch.Tensor]:
    config = {handler.config_section: section}
    handler.initialize(Context("m", str(tmp), {"model": {}}, 8, None, model_yaml_config=config))
    return [handler.preprocess([{"body": bytearray(image)}])[0] for image in images]


@pytest.mark.parametrize(
    ("name", "handler"),
    [("image_classifier", ImageClassifier), ("image_segmenter", ImageSegmenter)],
)
def test_the_model_gets_torchserves_input(
    name: str, handler: type[ImageClassifier], tmp_path: Path
) -> None:
    theirs = torchserve_preprocess(name, IMAGES, tmp_path)
    ours = _ferry_inputs(handler(), IMAGES, tmp_path)
    for index, (mine, reference) in enumerate(zip(ours, theirs, strict=True)):
        assert mine.shape == reference.shape == (3, 224, 224)
        difference = float((mine - reference).abs().max())
        assert torch.equal(mine, reference), f"image {index} ({SIZES[index // 2]}): {difference}"


def test_draft_decoding_is_an_opt_in_that_differs(tmp_path: Path) -> None:
    jpegs = IMAGES[0::2]
    theirs = torchserve_preprocess("image_classifier", jpegs, tmp_path)
    drafted = _ferry_inputs(ImageClassifier(), jpegs, tmp_path, draft_decode=True)
    differences = [float((a - b).abs().max()) for a, b in zip(drafted, theirs, strict=True)]
    # Draft mode decodes large JPEGs at a fraction of their size: those differ; a JPEG
    # smaller than twice the resize is decoded whole and matches.
    assert max(differences) > 1e-2
    assert differences[SIZES.index((300, 200))] < 1e-5
