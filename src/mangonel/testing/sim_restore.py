"""The ``restore-equals-live`` check of the simulation, at the cost of what each write changed.

After every write the simulator asks whether the store restores into the state
in memory. Restoring the whole store every time (``sim_world.restored_state``)
was most of a run's time: every job's plan and every task decoded again after
each event, though an event writes the keys of one job or two.

What a restored state exports is, job by job, a function of that job's keys
alone: ``read_snapshot`` sorts the keys by job and judges each job by its own
(whole, stale, broken), ``JobRecord.restore`` builds a job from its plan and its
progress, and ``SchedulerState.restore`` only files the jobs, the finished
ones and the registry side by side. ``RestoreCheck`` therefore restores, through
the same ``read_snapshot`` and ``SchedulerState.restore``, only the jobs whose
keys changed since the last check (and the registry and ``meta`` when theirs
did), and keeps the documents of the rest from before. The documents it returns
are those a restore of the whole store would give;
``tests/unit/test_cluster_sim.py`` runs both side by side on every check of
several seeds to hold it to that, and a mismatch is confirmed by a whole
restore before it is reported.

>>> from mangonel.scheduler.state import SchedulerState
>>> check = RestoreCheck(SchedulerState)
>>> check.documents({})["since"]
'None'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mangonel.scheduler.persist import StoredPlan, decode
from mangonel.scheduler.state import SchedulerState
from mangonel.scheduler.state_stages import TaskRecord
from mangonel.testing.sim_world import Encodings, restored_from, state_documents

_KEPT = (StoredPlan, TaskRecord)
"""What a restore never changes once decoded, so one object serves every restore
of the same text: a plan is frozen, and a task is only filed into its stage (its
fields change by events, and the states restored here handle none)."""


def _job_of(key: str) -> str | None:
    """The job a store key belongs to (``jobs/<id>/...``), ``None`` for a scheduler-wide key."""
    if key.startswith("jobs/"):
        return key.split("/", 2)[1]
    return None


class RestoreCheck:
    """``state_documents`` of the state the store restores into, restoring only
    what changed since the last call (see the module's docstring).

    Args:
        fresh: Makes the fresh state machine each restore starts from.
    """

    def __init__(self, fresh: Callable[[], SchedulerState]) -> None:
        self._fresh = fresh
        self._seen: dict[str, str] = {}
        """The store as the last call read it."""
        self._jobs: dict[str, dict[str, str]] = {}
        """Job id -> the documents its keys restore into (none for a stale job)."""
        self._shared: dict[str, str] = {}
        """The documents of the scheduler-wide keys (``executors``, ``since``)."""
        self._encodings = Encodings()
        """Texts of the tasks decoded before (the same objects: ``_decode``)."""
        self._decoded: dict[tuple[type[Any], str], Any] = {}
        """Plans and tasks decoded before, by their text."""

    def _decode(self, text: str, kind: type[Any]) -> Any:
        """``persist.decode``, once for each text of a kind in ``_KEPT``."""
        if kind not in _KEPT:
            return decode(text, kind)
        found = self._decoded.get((kind, text))
        if found is None:
            found = self._decoded[kind, text] = decode(text, kind)
        return found

    def documents(self, data: Mapping[str, str]) -> dict[str, str]:
        """The documents of the state ``data`` (the whole store) restores into.

        Raises:
            Violation: a job's keys cannot be restored (``restore``).
        """
        changed = {key for key, _ in data.items() ^ self._seen.items()}
        first = not self._seen and not self._shared
        jobs = {j for j in map(_job_of, changed) if j is not None}
        shared = first or any(_job_of(k) is None for k in changed)
        if jobs or shared:
            part = {
                key: text
                for key, text in data.items()
                if (job := _job_of(key)) in jobs or (job is None and shared)
            }
            restored_state = restored_from(part, self._fresh, self._decode)
            restored = state_documents(restored_state, self._encodings)
            self._encodings.forget()
            if len(self._decoded) > 50_000:
                self._decoded.clear()
            by_job: dict[str, dict[str, str]] = {}
            for name, doc in restored.items():
                if name.startswith(("job/", "finished/")):
                    by_job.setdefault(name.split("/", 2)[1], {})[name] = doc
            for job in jobs:
                if job in by_job:
                    self._jobs[job] = by_job[job]
                else:
                    self._jobs.pop(job, None)
            if shared:
                self._shared = {"executors": restored["executors"], "since": restored["since"]}
        self._seen = dict(data)
        docs = dict(self._shared)
        for held in self._jobs.values():
            docs.update(held)
        return docs
