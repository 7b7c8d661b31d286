"""Prometheus metrics of a scheduler, served at ``/metrics``.

Gauges (executors and tasks by state) are read from the scheduler at each
scrape; counters and the job-duration histogram are the running totals of
``scheduler.telemetry.Telemetry``. A registry of its own per app, so several
schedulers in one process (tests) do not mix their numbers.

Metrics (all prefixed ``mangonel_``):

* ``executors{state}``: executors the scheduler lists, by state (lost ones
  for a bounded history);
* ``executors_lost_total{reason}``: executors lost since start, by reason;
* ``executors_false_losses_total``: executors declared lost that came back
  alive (asked to resume their id): false losses, also logged each
  ("executor X came back after it was lost: ...");
* ``tasks{state}``: tasks of unfinished jobs: pending, running, done;
* ``task_attempts_launched_total``, ``task_attempts_ended_total{outcome}``;
* ``task_retries_total``: attempts launched because an earlier attempt of the
  task made no output (it failed, was lost or cancelled);
* ``outputs_recomputed_total``: attempts launched to make again an output that
  was lost (with its executor, or a missing or corrupt file);
* ``speculative_attempts_total{result}``: copies of straggling attempts
  ``launched``, and how they ended: ``won`` (finished first, their output
  kept) or ``lost`` (cancelled: the attempt they copied finished first);
* ``executors_distrusted{executor,as}``: 1 for each executor now suspected
  (its silence is improbable), quarantined (a flapping link), lagging (its
  command stream held up) or marked behind a slow link (``slow_link``: no new
  task until its back-off ends), by ``as``.
* ``executors_excluded{executor}``: 1 for each executor now excluded from new
  tasks for failing them (the reason is on the web UI's executors page);
* ``shuffle_bytes_written_total``: bytes of shuffle files reported by tasks;
* ``shuffle_bytes_fetched_total``: bytes of shuffle files given to tasks that
  completed, as their inputs (broadcast inputs count once per reading task);
* ``job_duration_seconds{outcome}``: histogram of job durations, submit to end;
* ``plan_fallbacks_total``: jobs whose plan runs the whole query in one task over
  its tables, because the planner does not split it (EXPLAIN's note says
  why: ``DistributedPlan.fallback``);
* ``plans_total{cache}``: queries planned (``miss``) or whose plan was reused
  (``hit``: the same SQL against the same tables);
* ``tables{state}``: catalog tables, ``readable``, or ``unreadable`` (kept in the
  store, their files not readable now: ``mangonel tables`` says why);
* ``retirements_waiting``: replaces and drops of tables whose old files wait for
  the queries that may read them before they are deleted.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from mangonel.scheduler.core import SchedulerCore
from mangonel.scheduler.state_views import ExecutorState
from mangonel.scheduler.telemetry import JOB_SECONDS_BUCKETS, AttemptOutcome

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class SchedulerCollector(Collector):
    """Reads one scheduler's state and totals at every scrape."""

    def __init__(self, core: SchedulerCore) -> None:
        self.core = core

    def collect(self) -> Iterator[Metric]:
        core = self.core
        executors = GaugeMetricFamily(
            "mangonel_executors", "Executors the scheduler lists, by state", labels=["state"]
        )
        counts = {p.value: 0 for p in ExecutorState}
        for entry in core.executors():
            counts[entry.view.state.value] += 1
        for state, n in counts.items():
            executors.add_metric([state], n)
        yield executors

        tasks = GaugeMetricFamily(
            "mangonel_tasks", "Tasks of unfinished jobs, by state", labels=["state"]
        )
        pending = running = done = 0
        for record in core.jobs():
            with record.changed:
                if record.state.finished:
                    continue
                for v in record.stage_views():
                    pending += v.pending
                    running += v.running
                    done += v.done
        for state, n in (("pending", pending), ("running", running), ("done", done)):
            tasks.add_metric([state], n)
        yield tasks

        totals = core.telemetry.counters()
        lost = CounterMetricFamily(
            "mangonel_executors_lost", "Executors lost since start, by reason", labels=["reason"]
        )
        for reason, n in sorted(totals.executors_lost.items()):
            lost.add_metric([reason], n)
        yield lost
        yield CounterMetricFamily(
            "mangonel_executors_false_losses",
            "Executors declared lost that came back alive since start",
            value=totals.false_losses,
        )
        yield CounterMetricFamily(
            "mangonel_task_attempts_launched",
            "Task attempts launched since start",
            value=totals.attempts_launched,
        )
        ended = CounterMetricFamily(
            "mangonel_task_attempts_ended", "Task attempts ended, by outcome", labels=["outcome"]
        )
        for outcome in AttemptOutcome:
            if outcome is not AttemptOutcome.RUNNING:
                ended.add_metric([outcome.value], totals.attempts_ended.get(outcome.value, 0))
        yield ended
        yield CounterMetricFamily(
            "mangonel_task_retries",
            "Attempts launched because an earlier attempt of the task made no output",
            value=totals.task_retries,
        )
        yield CounterMetricFamily(
            "mangonel_outputs_recomputed",
            "Attempts launched to make again a finished task's lost output",
            value=totals.outputs_recomputed,
        )
        speculative = CounterMetricFamily(
            "mangonel_speculative_attempts",
            "Copies of straggling task attempts: launched, won (kept), lost (cancelled)",
            labels=["result"],
        )
        speculative.add_metric(["launched"], totals.speculative_launched)
        speculative.add_metric(["won"], totals.speculative_won)
        speculative.add_metric(["lost"], totals.speculative_lost)
        yield speculative
        excluded = GaugeMetricFamily(
            "mangonel_executors_excluded",
            "Executors now excluded from new tasks for failing them",
            labels=["executor"],
        )
        for entry in core.executors():
            if entry.view.excluded_until is not None:
                excluded.add_metric([entry.view.id], 1)
        yield excluded
        distrusted = GaugeMetricFamily(
            "mangonel_executors_distrusted",
            "Executors now suspected (silent), quarantined (a flapping link), lagging (its "
            "command stream held up) or marked behind a slow link (no new task until its "
            "back-off ends)",
            labels=["executor", "as"],
        )
        for entry in core.executors():
            if entry.view.quarantined_until is not None:
                distrusted.add_metric([entry.view.id, "quarantined"], 1)
            elif entry.view.suspected_since is not None:
                distrusted.add_metric([entry.view.id, "suspected"], 1)
            elif entry.view.lagging_since is not None:
                distrusted.add_metric([entry.view.id, "lagging"], 1)
            elif entry.view.slow_link_since is not None:
                distrusted.add_metric([entry.view.id, "slow_link"], 1)
        yield distrusted
        yield CounterMetricFamily(
            "mangonel_shuffle_bytes_written",
            "Bytes of shuffle files written by task attempts",
            value=totals.shuffle_bytes_written,
        )
        yield CounterMetricFamily(
            "mangonel_shuffle_bytes_fetched",
            "Bytes of shuffle files read as inputs by task attempts that completed",
            value=totals.shuffle_bytes_fetched,
        )
        latency = HistogramMetricFamily(
            "mangonel_job_duration_seconds",
            "Job durations from submit to end, by outcome",
            labels=["outcome"],
        )
        bounds = [f"{b:g}" for b in JOB_SECONDS_BUCKETS] + ["+Inf"]
        for job_outcome, cumulative in sorted(totals.job_seconds_buckets.items()):
            latency.add_metric(
                [job_outcome],
                [(bound, float(n)) for bound, n in zip(bounds, cumulative, strict=True)],
                sum_value=totals.job_seconds_sum.get(job_outcome, 0.0),
            )
        yield latency
        yield CounterMetricFamily(
            "mangonel_plan_fallbacks",
            "Jobs whose plan runs the whole query in one task (the planner does not split it)",
            value=totals.plan_fallbacks,
        )
        plans = CounterMetricFamily(
            "mangonel_plans",
            "Queries planned (miss) or whose plan was reused (hit), since start",
            labels=["cache"],
        )
        plans.add_metric(["hit"], core.plans.hits)
        plans.add_metric(["miss"], core.plans.misses)
        yield plans
        tables = GaugeMetricFamily(
            "mangonel_tables",
            "Catalog tables: readable, or unreadable (kept, their files not readable now)",
            labels=["state"],
        )
        tables.add_metric(["readable"], len(core.tables()))
        tables.add_metric(["unreadable"], len(core.unreadable.entries()))
        yield tables
        yield GaugeMetricFamily(
            "mangonel_retirements_waiting",
            "Replaces and drops whose old files wait for the queries that may read them",
            value=core.retirements_waiting(),
        )


def make_registry(core: SchedulerCore) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SchedulerCollector(core))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry's metrics in Prometheus's text format."""
    return generate_latest(registry)
