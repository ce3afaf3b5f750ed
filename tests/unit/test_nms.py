from __future__ import annotations

import torch

from ferry.handlers.builtin.nms import batched_nms, box_iou, nms_torch


def test_iou() -> None:
    boxes = torch.tensor([[0.0, 0, 10, 10]])
    others = torch.tensor([[0.0, 0, 10, 10], [5.0, 0, 15, 10], [20.0, 20, 30, 30]])
    assert torch.allclose(box_iou(boxes, others), torch.tensor([[1.0, 50 / 150, 0.0]]))


def test_nms_keeps_the_best_of_overlapping_boxes() -> None:
    boxes = torch.tensor([[0.0, 0, 10, 10], [1.0, 1, 11, 11], [20.0, 20, 30, 30], [0.5, 0, 10, 10]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.95])
    assert nms_torch(boxes, scores, 0.5).tolist() == [3, 2]
    assert nms_torch(boxes, scores, 0.99).tolist() == [3, 0, 1, 2]
    assert nms_torch(torch.empty(0, 4), torch.empty(0), 0.5).numel() == 0


def test_batched_nms_never_suppresses_across_labels() -> None:
    boxes = torch.tensor([[0.0, 0, 10, 10], [0.0, 0, 10, 10], [0.0, 0, 10, 10]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    labels = torch.tensor([0, 1, 0])
    assert sorted(batched_nms(boxes, scores, labels, 0.5).tolist()) == [0, 1]
    assert batched_nms(torch.empty(0, 4), torch.empty(0), torch.empty(0), 0.5).numel() == 0
