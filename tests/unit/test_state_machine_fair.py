"""Fair shares of the slots between concurrent jobs, in the pure state machine.

Same style as ``test_state_machine.py`` (whose ``Harness`` and plans it reuses):
hand-built events in, exact ``LaunchTask`` commands out. The rule under test
(``SchedulerState._assign``): each free slot goes to the job holding the fewest
slots, ties to the earlier submitted; a job that cannot use a slot leaves it to
the others (work-conserving). Submission order alone (the rule before) would
give every slot to the first job while it has a pending task: the later tests
here fail under it.
"""

from __future__ import annotations

import pytest
from test_state_machine import (
    E1,
    E2,
    E3,
    J1,
    J2,
    Harness,
    att,
    launches,
    three_stage_plan,
)

from mangonel.client import cli
from mangonel.ids import ExecutorId, JobId
from mangonel.scheduler.events import ExecutorConnected, ExecutorRegistered, Limits
from mangonel.task import ExecutionError, ExecutorInfo

J3 = JobId("j3")


def held(h: Harness) -> dict[str, int]:
    """Job -> slots its running attempts hold, over every executor."""
    counts: dict[str, int] = {}
    for view in h.state.executors():
        for attempt in h.state.running_attempts(ExecutorId(view.id)):
            counts[attempt.task.job] = counts.get(attempt.task.job, 0) + 1
    return counts


def busy(maps: int, *jobs: JobId) -> Harness:
    """e1 and e2 with 4 slots each; ``jobs`` submitted in order, ``maps`` scan tasks each."""
    h = Harness()
    h.register(E1, 4)
    h.register(E2, 4)
    for job in jobs:
        h.submit(three_stage_plan(maps=maps, reducers=1), job)
    return h


def test_two_waiting_jobs_split_the_slots_evenly_earlier_first_on_ties() -> None:
    h = Harness()
    h.submit(three_stage_plan(maps=6, reducers=1), J1)
    h.submit(three_stage_plan(maps=6, reducers=1), J2)  # no executor yet: both wait
    assert launches(h.register(E1, 4)) == [
        ("e1", "j1/s1/p0/a0"),
        ("e1", "j2/s1/p0/a0"),
        ("e1", "j1/s1/p1/a0"),
        ("e1", "j2/s1/p1/a0"),
    ]
    assert launches(h.register(E2, 4)) == [
        ("e2", "j1/s1/p2/a0"),
        ("e2", "j2/s1/p2/a0"),
        ("e2", "j1/s1/p3/a0"),
        ("e2", "j2/s1/p3/a0"),
    ]
    assert held(h) == {"j1": 4, "j2": 4}
    # A slot j1 frees goes back to j1 (3 against 4), and one j2 frees to j2.
    assert launches(h.complete(att(1, 0), E1)) == [("e1", "j1/s1/p4/a0")]
    assert launches(h.complete(att(1, 3, job=J2), E2)) == [("e2", "j2/s1/p4/a0")]


def test_a_job_alone_takes_every_slot() -> None:
    h = busy(20, J1)
    assert held(h) == {"j1": 8}
    assert launches(h.complete(att(1, 0), E1)) == [("e1", "j1/s1/p8/a0")]


def test_a_job_submitted_later_gets_the_next_free_slots_until_it_holds_its_share() -> None:
    h = busy(100, J1)  # a long job: 100 scan tasks on 8 slots, all of them taken
    assert launches(h.submit(three_stage_plan(maps=8, reducers=1), J2)) == []  # no free slot
    # No preemption: j2 waits for slots to free, and gets each one that does.
    assert launches(h.complete(att(1, 0), E1)) == [("e1", "j2/s1/p0/a0")]
    assert launches(h.complete(att(1, 1), E2)) == [("e2", "j2/s1/p1/a0")]
    assert launches(h.complete(att(1, 2), E1)) == [("e1", "j2/s1/p2/a0")]
    assert launches(h.complete(att(1, 3), E2)) == [("e2", "j2/s1/p3/a0")]
    assert held(h) == {"j1": 4, "j2": 4}
    # Even now, a slot goes to whichever holds fewer: j1 with 3, then j2 with 3.
    assert launches(h.complete(att(1, 4), E1)) == [("e1", "j1/s1/p8/a0")]
    assert launches(h.complete(att(1, 0, job=J2), E1)) == [("e1", "j2/s1/p4/a0")]
    assert held(h) == {"j1": 4, "j2": 4}


def test_three_jobs_share_eight_slots_three_three_two() -> None:
    h = busy(100, J1)
    h.submit(three_stage_plan(maps=50, reducers=1), J2)
    h.submit(three_stage_plan(maps=50, reducers=1), J3)
    freed = [launches(h.complete(att(1, p), E1 if p % 2 == 0 else E2))[0][1] for p in range(6)]
    # j2 and j3 hold none, then one each (ties: j2 first), then two each; at the
    # sixth slot j1 is down to two as well, and is the earliest of the tied.
    assert freed == [
        "j2/s1/p0/a0",
        "j3/s1/p0/a0",
        "j2/s1/p1/a0",
        "j3/s1/p1/a0",
        "j2/s1/p2/a0",
        "j1/s1/p8/a0",
    ]
    assert held(h) == {"j1": 3, "j2": 3, "j3": 2}
    # A slot j2 frees goes back to j2 (tied with j3 at two, submitted first);
    # one j3 frees, back to j3 (one against three).
    assert launches(h.complete(att(1, 0, job=J2), E1)) == [("e1", "j2/s1/p3/a0")]
    assert launches(h.complete(att(1, 0, job=J3), E2)) == [("e2", "j3/s1/p2/a0")]


def test_a_slot_a_job_cannot_use_goes_to_the_others() -> None:
    # Work-conserving: j2 has one scan task and its next stage waits for it, so
    # every other slot stays j1's, however many j1 holds.
    h = busy(100, J1)
    h.submit(three_stage_plan(maps=1, reducers=1), J2)
    assert launches(h.complete(att(1, 0), E1)) == [("e1", "j2/s1/p0/a0")]
    assert launches(h.complete(att(1, 1), E2)) == [("e2", "j1/s1/p8/a0")]
    assert launches(h.complete(att(1, 2), E1)) == [("e1", "j1/s1/p9/a0")]
    assert held(h) == {"j1": 7, "j2": 1}
    # Once j2's next stage is runnable, it is the one holding fewer again.
    assert launches(h.complete(att(1, 0, job=J2), E1)) == [("e1", "j2/s2/p0/a0")]


def test_a_task_waiting_to_avoid_where_it_failed_leaves_the_slot_to_another_job() -> None:
    # j1 holds fewer slots, but its only pending task failed on the executor
    # whose slot is free and waits for the other one: the slot goes to j2.
    h = Harness()
    h.register(E1, 1)
    h.register(E2, 2)
    assert launches(h.submit(three_stage_plan(maps=1, reducers=1), J1)) == [("e1", "j1/s1/p0/a0")]
    assert launches(h.submit(three_stage_plan(maps=4, reducers=1), J2)) == [
        ("e2", "j2/s1/p0/a0"),
        ("e2", "j2/s1/p1/a0"),
    ]
    cmds = h.fail(att(1, 0), E1, ExecutionError("disk full"))
    assert launches(cmds) == [("e1", "j2/s1/p2/a0")]
    # The next slot to free on e2 is j1's (0 against 3), and its task runs there.
    assert launches(h.complete(att(1, 0, job=J2), E2)) == [("e2", "j1/s1/p0/a1")]


# ------------------------------------------------------------- a cap per job


def test_with_a_cap_a_job_alone_leaves_slots_for_a_job_arriving_later() -> None:
    h = Harness(Limits(max_job_share=0.5))
    h.register(E1, 4)
    h.register(E2, 4)
    assert len(launches(h.submit(three_stage_plan(maps=100, reducers=1), J1))) == 4
    assert held(h) == {"j1": 4}
    assert launches(h.complete(att(1, 0), E1)) == [("e1", "j1/s1/p4/a0")]  # back to 4
    # A job arriving finds the other half free at once, though j1's tasks run on.
    cmds = h.submit(three_stage_plan(maps=100, reducers=1), J2)
    assert len(launches(cmds)) == 4 and held(h) == {"j1": 4, "j2": 4}
    # The cap counts the slots of alive executors: with e2 gone, half of four.
    h.lose(E2)
    assert held(h) == {"j1": 2, "j2": 2}
    assert launches(h.complete(att(1, 4), E1)) == [("e1", "j1/s1/p1/a1")]


def test_the_slots_a_job_may_hold_are_the_alive_ones_within_the_cap() -> None:
    # What the planner sizes exchanges by (``PlannerConfig.slots``).
    free = Harness(Limits())
    assert free.state.job_slots() == 0  # no executor: unknown to the planner
    free.register(E1, 4)
    free.register(E2, 2)
    assert free.state.job_slots() == 6
    capped = Harness(Limits(max_job_share=0.5))
    capped.register(E1, 4)
    capped.register(E2, 4)
    assert capped.state.job_slots() == 4
    capped.lose(E2)
    assert capped.state.job_slots() == 2


def test_a_job_is_planned_for_the_tasks_the_hosts_run_at_full_speed() -> None:
    # ``PlannerConfig.parallel``: a host's slots, no more than its cores hold
    # tasks of their threads; executors that did not say count every slot.
    h = Harness(Limits())
    for executor, host in ((E1, "h1"), (E2, "h1"), (E3, "h2")):
        info = ExecutorInfo(executor, host, f"{host}:{executor}", 1, cores=2, threads=2)
        h.send(ExecutorRegistered, info)
        h.send(ExecutorConnected, executor)
    # Host h1 (two executors of one slot, each on both of its two cores): one task.
    assert (h.state.job_slots(), h.state.job_parallel()) == (3, 2)
    h.register(ExecutorId("e4"), 4)  # host h4 (cores unknown): its four slots
    assert (h.state.job_slots(), h.state.job_parallel()) == (7, 6)
    h.lose(E3)
    assert (h.state.job_slots(), h.state.job_parallel()) == (6, 5)
    capped = Harness(Limits(max_job_share=0.5))
    for executor in (E1, E2):
        info = ExecutorInfo(executor, "h", f"h:{executor}", 4, cores=16, threads=2)
        capped.send(ExecutorRegistered, info)
        capped.send(ExecutorConnected, executor)
    # Eight slots on sixteen cores run at full speed; the cap holds a job to four.
    assert (capped.state.job_slots(), capped.state.job_parallel()) == (4, 4)


def test_a_cap_is_at_least_one_slot_and_a_share_in_range() -> None:
    h = Harness(Limits(max_job_share=0.1))
    h.register(E1, 4)
    assert launches(h.submit(three_stage_plan(maps=4, reducers=1), J1)) == [("e1", "j1/s1/p0/a0")]
    for share in (0.0, 1.5):
        with pytest.raises(ValueError, match="max_job_share must be in"):
            Limits(max_job_share=share)


def test_a_speculative_copy_counts_against_the_cap() -> None:
    # 2 slots of 8 at 0.25. p0, p1 run 0-1 s, p2 1-2 s; p3 (from 1 s) and p4
    # (from 2 s) run on, the job at its cap. At 2.6 s p3 straggles (1.6 s
    # against a 1 s median) but its copy would be a third slot.
    limits = Limits(
        max_job_share=0.25, speculation_quantile=0.5, speculation_min_s=1.0, exclusion_failures=0
    )
    h = Harness(limits)
    h.register(E1, 4)
    h.register(E2, 4)
    assert launches(h.submit(three_stage_plan(maps=5, reducers=1), J1)) == [
        ("e1", "j1/s1/p0/a0"),
        ("e2", "j1/s1/p1/a0"),
    ]
    h.now = 1.0
    assert launches(h.complete(att(1, 0), E1)) == [("e1", "j1/s1/p2/a0")]
    assert launches(h.complete(att(1, 1), E2)) == [("e2", "j1/s1/p3/a0")]
    h.now = 2.0
    assert launches(h.complete(att(1, 2), E1)) == [("e1", "j1/s1/p4/a0")]
    assert h.tick(2.6) == []
    # Once p4 is done, the job is under its cap: the straggler gets its copy.
    h.now = 2.7
    assert launches(h.complete(att(1, 4), E1)) == []
    assert launches(h.tick(2.8)) == [("e1", "j1/s1/p3/a1")]


def test_the_scheduler_command_refuses_a_share_out_of_range_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["scheduler", "--max-job-share", "1.5", "--port", "0", "--state", "memory://"]
    assert cli.main(argv) == 1  # before it serves anything
    err = capsys.readouterr().err
    assert err == "error: max_job_share must be in (0, 1], got 1.5\n"


def test_the_slots_held_kept_by_the_registry_match_a_count_of_the_running_attempts() -> None:
    # The registry keeps each job's held slots as attempts start and stop (fair
    # shares ask on every event); after launches, completions, a failure and a
    # lost executor, its counts must be what counting the running attempts gives.
    h = busy(20, J1, J2)
    registry = h.state._executors  # the counts under test are the registry's own
    assert registry.slots_held() == held(h) == {"j1": 8}  # j2 came after every slot was taken
    h.complete(att(1, 0), E1)
    h.complete(att(1, 1), E2)
    assert registry.slots_held() == held(h) == {"j1": 6, "j2": 2}
    h.complete(att(1, 0, job=J2), E2)
    h.fail(att(1, 2), E1, ExecutionError("boom"))
    assert registry.slots_held() == held(h)
    h.lose(E1)
    assert registry.slots_held() == held(h)
    assert sum(held(h).values()) == 4  # e2's four slots, e1's attempts gone with it
