"""Launchers: where a run's process runs. ``train.py`` trains in its own process (the local
launcher is :func:`rl_app.run.train` itself); ``launcher=slurm`` submits the same
``train(config)`` to SLURM:

- :mod:`rl_app.launch.cluster`: SLURM job settings, profiles and the submitit executor;
- :mod:`rl_app.launch.job`: what a SLURM job runs, a run or a sweep's worker (a save and a
  requeue on preemption);
- :mod:`rl_app.launch.slurm`: submitting a run, a job array or a sweep's workers;
- :mod:`rl_app.launch.ray_cluster`: a Ray cluster on the job's own nodes, for
  ``collector.mode=ray`` with ``ray.address`` unset.

Scale-out code (these modules, the collection backends other than direct mode, and the
Ray evaluator: ``SCALE`` in ``tests/test_layout.py``) is imported by the core only through
three doors: :func:`rl_app.collection.make_collector`, the loop's ``background_evaluator``
and :func:`rl_app.sweep.worker.submit_to_slurm` (``DOORS`` there). A direct-mode run loads
none of it.

To add a launcher: a module here with a ``submit(preset, overrides, config)`` that runs
:func:`rl_app.run.train` where it should (wrapping it as :class:`rl_app.launch.job.TrainJob`
does for requeues), ``launcher``'s choices in ``rl_app/config/schema.py``, and its branch
in ``train.py``."""
