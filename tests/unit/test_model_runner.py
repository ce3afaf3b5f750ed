"""Pure pieces of the worker slots: restart backoff and result mapping."""

from __future__ import annotations

from ferry.errors import HandlerFailed, InvalidInput
from ferry.scheduling.dispatcher import to_outcome as _to_outcome
from ferry.scheduling.jobs import Prediction
from ferry.scheduling.pool import Backoff
from ferry.wire.messages import ErrorKind, ItemResult


def test_backoff_doubles_to_a_cap_and_resets() -> None:
    backoff = Backoff(first=0.1, cap=0.5)
    assert [backoff.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.reset()
    assert backoff.next() == 0.1


def test_item_results_map_to_responses_and_domain_errors() -> None:
    ok = _to_outcome(ItemResult("r", b"{}", "application/json", 0, {"x": "1"}), batch_size=3)
    assert ok == Prediction(b"{}", "application/json", 200, {"x": "1"}, 3, request_id="r")
    bad = _to_outcome(ItemResult("r", b"", "", error_kind=ErrorKind.INVALID_INPUT, message="m"), 1)
    assert isinstance(bad, InvalidInput) and bad.message == "m"
    coded = _to_outcome(ItemResult("r", b"", "", 418, {}, ErrorKind.HANDLER, "t"), 1)
    assert isinstance(coded, HandlerFailed) and coded.status == 418
    plain = _to_outcome(ItemResult("r", b"", "", 0, {}, ErrorKind.HANDLER, "t"), 1)
    assert isinstance(plain, HandlerFailed) and plain.status is None
