"""The executor: a long-lived process that runs tasks and serves their output.

Modules, from the data path outwards:

* ``runner``: ``TaskRunner``, one task slot (a DuckDB database) running one ``TaskSpec``.
* ``shuffle``: ``ShuffleWriter`` / ``ShuffleReader``, Arrow IPC partition files,
  checksummed, read memory-mapped on the same host or over Flight.
* ``flight``: ``ShuffleFlightServer``, serves the files this executor wrote.
* ``failures``: ``TaskFailedError`` carrying the typed ``TaskFailure``.
* ``workdir``: ``WorkRoot``, the executor's locked directories and the sweep of
  directories whose owner died.
* ``faults``: ``FaultInjector``, the fault-injection rules of chaos tests.
* ``link``: ``SchedulerLink`` protocol and its gRPC implementation.
* ``service``: ``ExecutorService``, the control loop (register, commands,
  heartbeats, lives, drain).
* ``config`` / ``main``: ``ExecutorConfig``, ``run_executor``, the command line.
"""
