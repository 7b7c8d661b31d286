"""The executor: a long-lived process that runs tasks and serves their output.

Modules, from the data path outwards:

* ``runner``: ``TaskRunner``, one task slot (a DuckDB database) running one ``TaskSpec``.
* ``databases``: the slot's DuckDB databases, locked down, and its scan databases.
* ``scan``: Parquet splits read by DuckDB's reader, or by pyarrow from object storage.
* ``partitioning``: a task's result split by ``hash(keys) % N`` into its partitions.
* ``arrow_types``: DuckDB's own types across a shuffle, Arrow's in a query's result.
* ``spill``: ``SpillWatch``, how much the running task spills.
* ``memory``: the memory and spill budgets, and the allocators' settings.
* ``shuffle_write``: ``ShuffleWriter``, a task's output partitions as Arrow IPC
  files, checksummed as they are written.
* ``shuffle``: ``ShuffleReader``, a task's inputs read memory-mapped on the same
  host or fetched over Flight.
* ``flight``: ``ShuffleFlightServer``, serves the files this executor wrote.
* ``failures``: ``TaskFailedError`` carrying the typed ``TaskFailure``.
* ``workdir``: ``WorkRoot``, the executor's locked directories and the sweep of
  directories whose owner died.
* ``hooks``: ``TaskHooks``, the test hooks on a task's path, and the no-op default
  (chaos tests plug in ``testing.faults.FaultInjector``).
* ``link``: ``SchedulerLink`` protocol and its gRPC implementation.
* ``state``: ``ExecutorMachine``, the pure state machine of lives and tasks
  (``handle(event) -> actions``): every decision of the control loop.
* ``service``: ``ExecutorService``, the I/O shell that feeds it events and
  carries out its actions (register, stream, task slots, heartbeats, drain).
* ``config`` / ``main``: ``ExecutorConfig``, ``run_executor``, the command line.
"""
