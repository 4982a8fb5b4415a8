"""Scale-out: everything beyond one process on one machine.

- :mod:`rl_app.scale.workers`: collection in worker processes (``collector.mode=sync|async``);
- :mod:`rl_app.scale.distributed`: collection jobs on SLURM (``collector.mode=distributed``);
- :mod:`rl_app.scale.cluster`: SLURM job settings, profiles and the submitit executor;
- :mod:`rl_app.scale.job`: what a SLURM training job runs (requeue on preemption);
- :mod:`rl_app.scale.launch`: submitting a run or a job array (``launcher=slurm``).

The core (``rl_app/*.py``, ``rl_app/algorithms``) never imports these modules, except
:func:`rl_app.collection.make_collector`, which hands the modes it does not run itself to
the two collection backends. A direct-mode run loads none of them.
"""
