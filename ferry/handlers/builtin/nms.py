"""Non-maximum suppression in plain torch, so detection works without torchvision; when
torchvision is importable its kernel is used instead."""

from __future__ import annotations

import importlib
from typing import Any

import torch


def box_iou(boxes: torch.Tensor, others: torch.Tensor) -> torch.Tensor:
    """IoU of every (x1, y1, x2, y2) box in ``boxes`` with every box in ``others``."""
    area = (boxes[:, 2] - boxes[:, 0]).clamp(min=0) * (boxes[:, 3] - boxes[:, 1]).clamp(min=0)
    area_o = (others[:, 2] - others[:, 0]).clamp(min=0) * (others[:, 3] - others[:, 1]).clamp(min=0)
    top_left = torch.max(boxes[:, None, :2], others[None, :, :2])
    bottom_right = torch.min(boxes[:, None, 2:], others[None, :, 2:])
    overlap = (bottom_right - top_left).clamp(min=0).prod(dim=2)
    return overlap / (area[:, None] + area_o[None, :] - overlap).clamp(min=1e-9)


def nms_torch(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Indices of the boxes kept, highest score first (torchvision.ops.nms semantics)."""
    order = scores.argsort(descending=True)
    keep = []
    while order.numel() > 0:
        best = order[0]
        keep.append(best)
        if order.numel() == 1:
            break
        overlaps = box_iou(boxes[best].unsqueeze(0), boxes[order[1:]]).squeeze(0)
        order = order[1:][overlaps <= iou_threshold]
    return torch.stack(keep) if keep else torch.empty(0, dtype=torch.long)


def _torchvision_ops() -> Any | None:
    try:
        return importlib.import_module("torchvision.ops")
    except Exception:  # not installed, or built for another torch: use the torch path
        return None


def batched_nms(
    boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, iou_threshold: float
) -> torch.Tensor:
    """NMS within each label: boxes of different labels never suppress each other."""
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    ops = _torchvision_ops()
    if ops is not None:
        kept: torch.Tensor = ops.batched_nms(boxes, scores, labels, iou_threshold)
        return kept
    # Shift each label's boxes far apart so one NMS pass handles every label separately.
    offsets = labels.to(boxes.dtype) * (boxes.max() + 1)
    return nms_torch(boxes + offsets[:, None], scores, iou_threshold)
