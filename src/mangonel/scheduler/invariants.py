"""The error the scheduler state's self-check raises (``SchedulerState.validate``).

``validate`` recomputes every fact the state machine keeps incrementally (counts,
indexes, caches) and every rule that must hold between events, and raises
``StateInvariantError`` naming the first one broken and the ids involved. The
invariants, each under the name an error carries, are listed once, in
docs/architecture.md ("Invariants of the state"); each check in the code says
which one it is by that name.

Only the tests and the simulator call ``validate`` (after every event): it costs
a pass over the whole state, which the scheduler's shell never pays.

>>> raise StateInvariantError("stage-counts", "stage 1 of job j1: done is 3, ...")
Traceback (most recent call last):
...
mangonel.scheduler.invariants.StateInvariantError: [stage-counts] stage 1 of job j1: done is 3, ...
"""

from __future__ import annotations


class StateInvariantError(AssertionError):
    """An invariant of the scheduler's state does not hold: a bug in the state machine.

    Attributes:
        invariant: Its name in docs/architecture.md ("Invariants of the state").
        detail: What was found, with the ids of the jobs, tasks and executors.
    """

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"[{invariant}] {detail}")
        self.invariant = invariant
        self.detail = detail
