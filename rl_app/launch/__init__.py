"""Scale-out: everything beyond one process on one machine.

- :mod:`rl_app.collection.workers`: collection in worker processes (``collector.mode=sync|async``);
- :mod:`rl_app.collection.distributed`: collection jobs on SLURM (``collector.mode=distributed``);
- :mod:`rl_app.launch.cluster`: SLURM job settings, profiles and the submitit executor;
- :mod:`rl_app.launch.job`: what a SLURM job runs, a run or a sweep's worker (requeue on
  preemption);
- :mod:`rl_app.launch.slurm`: submitting a run, a job array (``launcher=slurm``) or a
  sweep's workers.

The core (``rl_app/*.py``, ``rl_app/algorithms``) never imports these modules, except
:func:`rl_app.collection.make_collector`, which hands the modes it does not run itself to
the two collection backends, and :func:`rl_app.sweep.worker.submit_to_slurm`, which submits
a sweep's workers (``launcher: slurm``). A direct-mode run loads none of them.
"""
