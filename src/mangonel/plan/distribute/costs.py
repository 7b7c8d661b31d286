"""The distributor's cost model: what a byte costs through each way of moving it.

The join strategy (``joins``) compares these per choice; the semi-join reduction
(``reductions``) and the range join (``ranges``) read their thresholds here. Each
number says where it was measured.
"""

from __future__ import annotations

SHUFFLE_COST = 1.0
"""Cost of a byte through a hash exchange (hashed, split, written, read back)
relative to a byte of a broadcast side (built into a hash table in every task of
the other side). About equal, measured on TPC-H SF1 in one slot
(``benchmarks/inproc.py``): q5's 6 MB of filtered orders broadcast to 9 lineitem
tasks beats shuffling 240 MB of lineitem (2.8 -> 0.55 s), while q21's 9.5 MB of
orders broadcast to 9 tasks cost 0.5 s more than shuffling 7.6 + 9.5 MB."""


EXCHANGE_FIXED = 16 * 1024 * 1024
"""What a hash exchange costs besides its bytes, per side that moves, in the bytes
of ``SHUFFLE_COST``: a stage that writes the side's partitions and the round trip
of its reports and launches (~15-25 ms on a 2-core host, the time an exchange
takes to move about that many bytes). Without it a join of a spread scan
(several tasks on hosts of their own cores) with a small table hashed both sides
when a broadcast cost about the same (TPC-H q05 at SF10: ``orders`` in 2 tasks
with ``customer``, 69.5 against 72 MB), and the shuffled join could no longer be
joined into ``lineitem``'s tasks by key ranges: 700 MB of ``lineitem`` hashed
instead. It changes 11 plans of TPC-H SF1 and SF10 and TPC-DS SF1 on two hosts of
one core, the same 11 from 8 to 32 MiB, and none on one host. Counted where the
hosts run tasks side by side (``PlannerConfig.parallel`` over 1), where it was
measured; elsewhere the bytes alone decide, as before."""

BROADCAST_COST = 1.5
"""Cost of a broadcast byte in each task that receives it, relative to a shuffled byte:
every task builds its own hash table of the broadcast side. TPC-H q9 at SF1 broadcast
1.5M orders and 800k partsupp rows into each of 5 lineitem tasks at 1.0 (0.71 s in an
A/B, ``benchmarks/ab.py``); at 1.5 it shuffles the filtered lineitem to meet orders
(0.54 s). At 2.0, q18 shuffles lineitem too, where its (misestimated: 57 rows, not
750k) orders are better broadcast (0.65 -> 0.75 s)."""


REDUCE_RATIO = 4.0
"""The far side of a semi / anti join is first reduced by the kept side's keys when it
is estimated this many times bigger (``reductions.reduce_by_keys``)."""

RANGE_COPIES = 0.5
"""A range join reads at most this share of the copies of its source a broadcast
would make beyond the first (0: each row group once; 1: all of it in every task)."""

RANGE_REDUCES = 0.5
"""A semi / anti join whose far side a range join reads with at most this many
duplicated bytes (relative to the smaller side) is not first reduced by keys."""

PARTIAL_KEEPS = 0.5
"""An aggregate by one key is not split into partial and final phases where the
partial rows are estimated at more than this fraction of its input. Where each
row of a task is hashed into a table of nearly as many groups, the partial phase
costs about what the final one then saves, and it spares the exchange too few
rows: with a byte through an exchange costing about a row hashed, it pays only
below half. Measured on TPC-H q18 in a random order (6M rows, 2.6M partial rows):
0.74 of the time and 0.76 of the CPU without it (``benchmarks/ab.py``, SF1, 5 runs)."""
