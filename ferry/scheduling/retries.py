"""What becomes of the requests a failed worker held (``ferry.scheduling.dispatcher``).

Isolating the culprit: a request that was alone in its batch when the worker failed is
answered with the error at once — it is what killed (or hung) the worker, and retrying it
would only take down another. When the batch held several requests, each becomes a
*suspect* and is retried alone, ahead of the queue, so only the poison request fails and
its batch-mates are answered. Requests the worker held but had not started on go back to
the queue's front.
"""

from __future__ import annotations

from ferry.errors import FerryError
from ferry.scheduling.batch_queue import BatchQueue
from ferry.scheduling.jobs import Job
from ferry.scheduling.lanes import BatchSource

MAX_ATTEMPTS = 2
"""Times a request may be worked on: a batch whose worker failed is retried request by
request (see above); a request that fails its worker a second time is answered."""
MAX_RETURNS = 3
"""Times a request may go back to the queue from a worker that failed before starting it."""


def isolate_or_fail(
    jobs: list[Job], error: FerryError, lone_is_culprit: bool, suspects: BatchQueue[Job]
) -> int:
    """After a worker failed holding ``jobs`` (one batch): a lone request is the culprit
    and gets ``error``; several go to ``suspects``, each to be retried alone. Returns how
    many were put there."""
    waiting = [job for job in jobs if not job.future.done()]
    if (len(jobs) == 1 and lone_is_culprit) or not waiting:
        for job in waiting:
            job.fail(error)
        return 0
    # A request that streamed parts is not run again: its client has them already. Nor
    # is one of a stateful sequence: the state it ran on died with the worker.
    retried = [
        job
        for job in waiting
        if job.attempts < MAX_ATTEMPTS and not job.streamed and job.sequence_id is None
    ]
    for job in waiting:
        if job not in retried:
            job.fail(error)
    if retried:
        suspects.put_front(retried)
    return len(retried)


def requeue_unstarted(jobs: list[Job], error: FerryError, source: BatchSource) -> None:
    """Requests a failed worker held but had not started on go back to the front of
    ``source``: nothing points at them, so the attempt does not count. ``MAX_RETURNS``
    bounds how often (workers that never read anything must not bounce them forever)."""
    waiting = [job for job in jobs if not job.future.done()]
    for job in waiting:
        job.attempts -= 1
        job.returns += 1
    retry = [job for job in waiting if job.returns <= MAX_RETURNS]
    for job in waiting:
        if job not in retry:
            job.fail(error)
    if retry:
        source.put_front(retry)


__all__ = ["MAX_ATTEMPTS", "MAX_RETURNS", "isolate_or_fail", "requeue_unstarted"]
