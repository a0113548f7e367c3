"""Capture of torchvision and timm models (the optional ``models`` extra), real and fake
(``meta=True``: built under fake tensors, weight initializers skipped), and the repeated blocks
read from their module paths."""

import functools

import pytest
import torch

_MISSING = "needs torchvision and timm: pip install -e '.[models]' (see pyproject.toml)"
torchvision = pytest.importorskip("torchvision", reason=_MISSING)
timm = pytest.importorskip("timm", reason=_MISSING)

from opt_remat.build import problem_from_joint  # noqa: E402  (after the skips)
from opt_remat.capture import capture_graphs  # noqa: E402
from solvers.blocks import find_blocks  # noqa: E402

pytestmark = [pytest.mark.models, pytest.mark.usefixtures("reset_dynamo")]

MODELS = {  # factory, image side, the blocks' class and count
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=10), 32, "BasicBlock", 8),
    "vit": (lambda: torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=3, num_heads=2, hidden_dim=32, mlp_dim=64,
        num_classes=10), 32, "EncoderBlock", 3),
    "vit_tiny": (lambda: timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32,
                                           patch_size=8, depth=3, num_classes=10), 32, "Block", 3),
}


class _Step(torch.nn.Module):
    def __init__(self, factory):
        super().__init__()
        self.model = factory()

    def forward(self, x):
        return self.model(x).sum()


@functools.lru_cache(maxsize=None)
def _problem(name: str, meta: bool):
    factory, side, *_ = MODELS[name]
    torch.manual_seed(0)
    (joint,) = capture_graphs(lambda: _Step(factory), (torch.randn(2, 3, side, side),), meta=meta)
    return problem_from_joint(joint)[1]


@pytest.mark.parametrize("meta", [True, False], ids=["fake", "real"])
@pytest.mark.parametrize("name", list(MODELS))
def test_capture_finds_the_blocks(name, meta):
    *_, module_class, count = MODELS[name]
    blocks = find_blocks(_problem(name, meta))
    assert blocks is not None
    assert blocks.module_class.rsplit(".", 1)[-1] == module_class
    assert len(blocks.paths) == count


@pytest.mark.parametrize("name", list(MODELS))
def test_fake_and_real_capture_give_the_same_graph(name):
    fake, real = _problem(name, True), _problem(name, False)
    assert [(n.name, n.op, n.bytes) for n in fake.nodes] == [(n.name, n.op, n.bytes) for n in real.nodes]
