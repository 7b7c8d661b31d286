"""Cut a logical plan into stages at exchanges.

The planner walks the logical tree bottom-up, growing a *fragment*: the part of
the tree that runs inside the current stage, with the number of tasks that run
it and how its rows are partitioned. An operator that needs rows that other
tasks hold closes the fragment into a stage and starts a new one over that
stage's output:

* join: whichever moves fewer bytes (sizes from ``plan.estimate``): broadcast a
  side (at most ``broadcast_bytes``), which copies it into every task of the other
  side, or hash both sides on the join keys, cast to one type (DuckDB's ``hash()``
  depends on the type), which moves each side once but costs more per byte; a side
  already partitioned on the keys does not move at all. Without equi keys, any side
  the kind allows is broadcast;
* aggregate: partial aggregate -> hash exchange on the group keys -> final;
  AVG as SUM/COUNT; aggregates that do not split (DISTINCT, ...) are computed
  whole after a hash exchange on the group keys;
* window: hash exchange on the common PARTITION BY keys;
* set operation: both sides hashed on all columns;
* ORDER BY ... LIMIT n: top-n per task, then the merge in one task;
* what has no key to split on (a global sort, an aggregate without GROUP BY
  that does not split, a FULL join without equi keys) gathers into one task.

No exchange is added where the rows are already partitioned as needed.

One module per job:

* ``distributor``: the walk, operator by operator (``Distributor``);
* ``stages``: fragments, and closing them into stages and exchanges;
* ``joins``: the join strategy, a typed choice (shuffle, broadcast, by key range);
* ``costs``: the cost model those choices compare;
* ``keys``: key types, and the casts that make both sides hash alike;
* ``ranges``: key ranges of scan tasks (clustered aggregates, range joins);
* ``reductions``: semi-join reductions before rows move;
* ``shared``: nodes read more than once, and the columns readers need;
* ``aggregates``: two-phase aggregates.
"""

from __future__ import annotations

from mangonel.plan.distribute.costs import (
    BROADCAST_COST,
    RANGE_COPIES,
    RANGE_REDUCES,
    REDUCE_RATIO,
    SHUFFLE_COST,
)
from mangonel.plan.distribute.distributor import Distributor
from mangonel.plan.distribute.stages import SCAN_INPUT, TINY_SCAN_BYTES, Frag, describe

__all__ = [
    "BROADCAST_COST",
    "RANGE_COPIES",
    "RANGE_REDUCES",
    "REDUCE_RATIO",
    "SCAN_INPUT",
    "SHUFFLE_COST",
    "TINY_SCAN_BYTES",
    "Distributor",
    "Frag",
    "describe",
]
