"""Parameter sweeps: a grid over benchmark parameters as one run folder per point, run by an executor.

:mod:`~thesis_lib.sweep.grid` (a sweep and its configurations), :mod:`~thesis_lib.sweep.ledger` (jobs and run states),
the executors :mod:`~thesis_lib.sweep.local` and :mod:`~thesis_lib.sweep.slurm`, :mod:`~thesis_lib.sweep.driver`
(submit, wait, resubmit failures), and :mod:`~thesis_lib.sweep.table` (a finished sweep as one table). The tests run the Slurm executor on a real
one-node Slurm on localhost (``tests/slurm_cluster.py``).
"""
