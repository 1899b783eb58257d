"""Parameter sweeps: a grid over benchmark parameters as one run folder per point, run by an executor.

:mod:`~thesis_lib.sweep.grid` (a sweep and its configurations), :mod:`~thesis_lib.sweep.ledger` (jobs and run states),
the executors :mod:`~thesis_lib.sweep.local` and :mod:`~thesis_lib.sweep.slurm`, :mod:`~thesis_lib.sweep.driver`
(submit, wait, resubmit failures), :mod:`~thesis_lib.sweep.table` (a finished sweep as one table) and
:mod:`~thesis_lib.sweep.cluster` (a one-node Slurm on localhost, for the tests and trials).
"""
