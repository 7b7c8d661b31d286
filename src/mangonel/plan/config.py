"""The distributed planner's knobs (``PlannerConfig``) and the scan splits they size.

Each knob's docstring gives the measurement behind its default (the defaults
themselves are in ``mangonel.defaults``; ``mangonel.options`` declares the
command-line options that set them). ``split_rows_for``, ``spread_tasks`` and
``scan_split_rows`` turn them into how many rows each scan task reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from mangonel import defaults

ONE_WAVE_SPLITS = 16
"""Where the hosts' cores bound how many tasks run at full speed at once, a scan
task reads up to this many splits' worth (``PlannerConfig.scan_split_rows``)."""
TWO_TASKS_SPLITS = 4
"""... and a scan of more than this many splits' worth runs as two tasks at least."""


@dataclass(frozen=True)
class PlannerConfig:
    """Knobs of the distributed planner.

    Attributes:
        partitions: the most output partitions of a hash exchange.
        partition_bytes: an exchange gets one partition per this many estimated
            bytes (at least one, at most ``partitions``): a task has a fixed cost
            (a DuckDB query, a file per partition, scheduling) that small
            exchanges need not pay many times over. 0: every exchange has
            ``partitions`` partitions.
        broadcast_bytes: a join side estimated above this many bytes is never
            broadcast (each task of the other side holds all of it); below, the
            distributor broadcasts it when that moves fewer bytes than hashing both
            sides (``plan.distribute``).
        split_rows: a scan task reads row groups adding up to about this many rows;
            ``None`` sizes splits from the columns read (see ``split_rows_for``).
        split_bytes: adaptive splits read about this many bytes of the scan's
            columns (in memory) per task: the work of a scan task grows with
            the bytes it decodes, its fixed cost does not. 192 MiB ran TPC-H SF1
            4 % faster than 96 MiB on two executors of one slot (``ab.py``, twice),
            as fast as 384 MiB.
        inline_scan_bytes: a small table a join broadcasts is scanned by every task
            of the other side, instead of in a stage of its own whose output is
            then broadcast, when the bytes of its columns times those tasks are at
            most this many (a stage and its scheduling round trip less). Kept
            small: DuckDB knows a broadcast input's exact size but guesses a
            filtered scan's, and may build its hash table on the wrong side (TPC-H
            q10's 1.5M orders scanned in the customer task: 0.09 -> 0.14 s). 0: never.
        fuse_bytes: a stage of one task whose only reader runs as one task is
            planned inside that task (``plan.distribute.stages``) while the two
            together scan at most this many bytes of tables (rows times the
            columns' width, as splits are sized; a scan within
            ``inline_scan_bytes`` is not counted: a join scans such a table in
            each of its tasks anyway). Past it, the producer is a stage of its
            own, which another executor runs at the same time. One split's worth
            (``split_bytes``): a fused task is then no longer than the scan tasks
            the planner makes anyway, and a cluster of many hosts spreads what it
            cannot hold. On one host (two executors, TPC-DS SF1, the 19 plans it
            changes) it ran as fast as no bound (time ratio 0.94 and 0.99 in two
            A/B runs, ``benchmarks/latency.py``). 0: no bound. None where the
            hosts run one task at full speed at a time (``parallel`` 1): no other
            executor runs the producer at the same time at full speed.
        recompute_bytes: a producer of one task that reads only tables (and
            the subqueries it computes) is computed again by each task that
            reads it, instead of once in a stage of its own, while the copies
            beyond the first scan at most this many bytes of tables (rows times
            the columns' width, every scan counted): a subquery several nodes
            read, within 2 MiB (TPC-DS q33's items of one category, read by
            three channels), and a side broadcast into the
            several tasks of a scan that reads no other stage (q17's filtered
            ``part`` into ``lineitem``'s tasks), and a shared node of one task
            that scans no table (q15's ``revenue``). The stage would be a round
            trip on the path of a reader that waits for nothing else (report,
            durable commit, launch, fetch: ~15-25 ms on a 2-core host). 32 MiB
            let random-layout q10's ``orders`` (28.6 MiB) into both ``lineitem``
            tasks: 1.33x slower in two interleaved A/B runs. 0: never.
        min_split_rows: adaptive splits are at least this big ...
        max_split_rows: ... and at most this big, so that a task's output stays
            within a slot's memory.
        spread_bytes: where several tasks run at full speed at once
            (``parallel``), a scan of at least this many bytes of columns a task
            is spread over them (``spread_tasks``) rather than run as one task
            while the other hosts idle.
        slots: task slots one job may hold (the scheduler's count when it plans);
            an exchange sized to more partitions than this gets a multiple of it
            (``distribute.stages.whole_waves``). 0: unknown, counts from bytes alone.
        parallel: of those, how many tasks the executors' hosts run at full speed
            at once (the scheduler's ``job_parallel``: a host's slots, but no more
            than its cores hold tasks of their DuckDB threads); where it is below
            the slots, a scan is whole waves of this many tasks of up to
            ``ONE_WAVE_SPLITS`` splits each (``scan_split_rows``). 0: unknown.
    """

    partitions: int = defaults.PARTITIONS
    partition_bytes: int = defaults.PARTITION_BYTES
    broadcast_bytes: int = defaults.BROADCAST_BYTES
    split_rows: int | None = None
    split_bytes: int = defaults.SPLIT_BYTES
    inline_scan_bytes: int = defaults.INLINE_SCAN_BYTES
    fuse_bytes: int = defaults.FUSE_BYTES
    recompute_bytes: int = defaults.RECOMPUTE_BYTES
    min_split_rows: int = defaults.MIN_SPLIT_ROWS
    spread_bytes: int = defaults.SPREAD_BYTES
    max_split_rows: int = defaults.MAX_SPLIT_ROWS
    slots: int = 0
    parallel: int = 0

    def split_rows_for(self, row_width: float) -> int:
        """Rows per scan task when the scanned columns take ``row_width`` bytes a
        row: fixed when ``split_rows`` is set, else ``split_bytes`` worth, within
        the min and max.

        >>> PlannerConfig().split_rows_for(96.0)  # 192 MiB of 96-byte rows
        2097152
        >>> PlannerConfig().split_rows_for(8.0)
        4000000
        >>> PlannerConfig(split_rows=1000).split_rows_for(48.0)
        1000
        """
        if self.split_rows is not None:
            return self.split_rows
        wanted = int(self.split_bytes / max(1.0, row_width))
        return max(self.min_split_rows, min(self.max_split_rows, wanted))

    def spread_tasks(self, rows: int, row_width: float) -> int:
        """The fewest tasks a scan of ``rows`` rows of ``row_width`` bytes runs as,
        so that every task the hosts run at full speed at once (``parallel``)
        has a share, each reading at least ``spread_bytes`` of the columns:
        below that a task's fixed cost (a launch, a report, a DuckDB query, and
        the exchange after it) outweighs the core it adds.
        1 where one task at a time runs at full speed or the count is unknown.

        On hosts of one core each, a scan of one split kept every other host
        idle for as long as it ran: 50-80 % of what a second host lost at SF1
        (``benchmarks/scaleout.py``, 2026-12-04 ``f63a4a2``), where 5 of the 22
        TPC-H queries and 76 of the 99 TPC-DS queries ran on one host.

        >>> PlannerConfig(slots=4, parallel=4).spread_tasks(1_500_000, 96.0)
        4
        >>> PlannerConfig(slots=4, parallel=4).spread_tasks(600_000, 128.0)  # 32 MiB each
        2
        >>> PlannerConfig(slots=4, parallel=4).spread_tasks(1_500_000, 24.0)  # 34 MiB: whole
        1
        >>> PlannerConfig(slots=4, parallel=1).spread_tasks(1_500_000, 96.0)
        1
        """
        if self.parallel < 2:
            return 1
        by_bytes = int(rows * row_width // max(1, self.spread_bytes))
        return max(1, min(self.parallel, by_bytes))

    def _wave_tasks(self, row_width: float, rows: int) -> int:
        """The tasks of a scan in whole waves of ``parallel``, each reading up to
        ``ONE_WAVE_SPLITS`` splits' worth (bytes and rows); two at least where
        tasks of ``TWO_TASKS_SPLITS`` splits' worth would be several.

        A scan of one task has no key ranges by which to join another table into
        its tasks or to aggregate in place (``distribute.ranges.KeyRanges``): its
        joins with big tables hash both sides (TPC-H q03 and q18 at SF10 on one
        host of one core, one task of ``lineitem``: 1.8 and 2.1 times the time).
        """

        def waves(splits: int) -> int:
            biggest = min(
                splits * self.max_split_rows,
                int(splits * self.split_bytes / max(1.0, row_width)),
            )
            return -(-rows // (self.parallel * max(1, biggest)))

        return max(waves(ONE_WAVE_SPLITS) * self.parallel, min(2, waves(TWO_TASKS_SPLITS)))

    def scan_split_rows(self, row_width: float, rows: int, spread: bool = True) -> int:
        """Rows per scan task of a table of ``rows`` rows: ``split_rows_for``, but
        where that makes more tasks than ``slots`` and not whole waves of them,
        the next fewer tasks that are (bigger ones, up to ``max_split_rows``).

        Each task of a scan stage builds its own hash table of every side it
        joins (broadcast or scanned whole) and pays a task's fixed cost; a task
        alone in a last wave has both cores for its DuckDB threads but repeats
        those costs once more. TPC-H q09 at SF1 (``lineitem`` in 3 tasks on 2
        slots, each joining all 1.5M ``orders`` and 800k ``partsupp`` rows): 2
        tasks ran it in 0.80 to 0.88 of the time, q01 0.86, q19 0.81
        (interleaved, a loaded machine). A split size fixed by ``split_rows``
        is left as it is.

        >>> PlannerConfig(slots=2).scan_split_rows(96.0, 6_000_000)  # 3 tasks -> 2
        3000000
        >>> PlannerConfig(slots=2).scan_split_rows(16.0, 6_000_000)  # 2 already
        4000000
        >>> PlannerConfig(slots=2).scan_split_rows(96.0, 10_000_000)  # 5 tasks -> 4
        2500000
        >>> PlannerConfig(slots=0).scan_split_rows(96.0, 6_000_000)  # slots unknown
        2097152

        Where the hosts' cores, not their slots, bound how many tasks run at full
        speed at once (``parallel`` below the slots and the tasks), tasks past
        that many share cores: a finer split runs no sooner and pays more tasks'
        costs. The scan is then whole waves of ``parallel`` tasks, each reading up
        to ``ONE_WAVE_SPLITS`` splits' worth (bytes and rows; ``_wave_tasks``). ``LocalCluster`` on
        two cores (two executors of one slot, each slot's DuckDB on both cores)
        runs one task at full speed: TPC-H SF1's ``lineitem`` was two tasks at
        once, each on half the cores, each filtering its row groups by row number
        (about a tenth of a scan's CPU), building its own hash table of every
        side it joins, and leaving a partial aggregate to merge; as one task the
        22 queries took 0.84 (generated) and 0.80 (random) of the time; at SF10,
        four tasks of 15M rows instead of fifteen of 4M, 0.85 (interleaved A/B
        against the code before, ``benchmarks/ab.py --base-src``); two of 30M
        instead of four, 0.96 of the time and CPU, the peak RSS 1.17 times
        (2026-12-06; tasks of 4 splits' worth before, 16 now).

        >>> PlannerConfig(slots=2, parallel=1).scan_split_rows(16.0, 6_000_000)  # 2 -> 1
        6000000
        >>> PlannerConfig(slots=2, parallel=1).scan_split_rows(16.0, 60_000_000)  # 15 -> 2
        30000000
        >>> PlannerConfig(slots=2, parallel=2).scan_split_rows(16.0, 6_000_000)  # as before
        4000000

        A job of one slot (one executor of one slot, or ``--max-job-share``) runs
        its tasks one after another: its scans are whole waves of one task too.

        >>> PlannerConfig(slots=1, parallel=1).scan_split_rows(16.0, 6_000_000)  # 2 -> 1
        6000000

        So do hosts that run each of their slots at full speed (``parallel`` equal
        to the slots): each host runs its share of a scan one task after another
        too, and every task pays a DuckDB query's fixed cost over the file's
        footer (at SF10, ``lineitem``'s 524 row groups: a query of one thread
        reading 1,000 rows took 3 ms over one column, 10 ms over q19's six with
        its filters, against 0.8 and 2.9 ms over SF1's 53 row groups: the
        filters are checked against every row group's statistics, whichever it
        reads) and builds its own hash table of every side it joins. Two hosts of
        one core at SF10: q06 ran as 16 tasks, 1.20x the executors' time of the 4
        tasks on one host; q19's ``lineitem`` (six columns) as 7 tasks on one
        host, 1.50 s of execution against 1.10 s for the same SQL over the whole
        file in one query. Tasks of 16 splits' worth rather than 4, two hosts of
        one core and one (``benchmarks/scaleout.py --base-src``, 2026-12-06, median
        of 3): 0.96 and 0.98 of the time, q19 0.82 and 0.86, q18 1.02 and 1.09
        (its aggregates by order hold twice the groups a task).

        >>> PlannerConfig(slots=2, parallel=2).scan_split_rows(16.0, 60_000_000)  # 15 -> 2
        30000000

        Where several tasks run at full speed at once (``parallel`` over 1: hosts
        of their own cores), a scan of fewer splits than that is spread over
        them (``spread_tasks``): one split would keep the other hosts idle.

        >>> PlannerConfig(slots=2, parallel=2).scan_split_rows(96.0, 1_500_000)  # 1 -> 2
        750000
        >>> PlannerConfig(slots=2, parallel=1).scan_split_rows(96.0, 1_500_000)  # one split
        2097152

        Not with ``spread`` False: a branch of a set operation (``Distributor``),
        whose sides of several tasks are hashed whole into its partitions.

        >>> PlannerConfig(slots=2, parallel=2).scan_split_rows(96.0, 1_500_000, spread=False)
        2097152
        """
        per = self.split_rows_for(row_width)
        if self.split_rows is not None or self.slots < 1:
            return per
        tasks = -(-rows // max(1, per))
        spread_to = self.spread_tasks(rows, row_width) if spread else 1
        if spread_to > tasks:
            return -(-rows // spread_to)
        if tasks <= self.slots or tasks % self.slots == 0:
            by_slots = per
        else:
            wider = -(-rows // (tasks // self.slots * self.slots))
            by_slots = wider if wider <= self.max_split_rows else per
        if 0 < self.parallel < tasks:
            # Never smaller tasks than the slots alone make (rows too wide for
            # the splits' bytes to reach the minimum split).
            return max(by_slots, -(-rows // self._wave_tasks(row_width, rows)))
        return by_slots
