"""Parameter sweeps: a grid over benchmark parameters as one run folder per point, run by an executor.

- :mod:`~thesis_lib.sweep.grid`: a sweep (base configuration, grid, home folder) and its points' configurations;
- :mod:`~thesis_lib.sweep.ledger`: which job ran which run, and each run's state (done, queued, running, failed);
- :mod:`~thesis_lib.sweep.local` and :mod:`~thesis_lib.sweep.slurm`: the executors (this machine; a Slurm cluster);
- :mod:`~thesis_lib.sweep.driver`: submit what is not done, wait with progress, report and resubmit failures;
- :mod:`~thesis_lib.sweep.table`: a finished sweep as one table;
- :mod:`~thesis_lib.sweep.cluster`: a one-node Slurm cluster on localhost (the tests', and for trying a sweep).
"""
