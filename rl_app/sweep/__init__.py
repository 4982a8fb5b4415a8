"""Hyperparameter sweeps: ``python -m rl_app.sweep SWEEP.yaml [--summary] [--worker]``.

A sweep file names a preset (and fixed ``overrides``), a search ``space`` in the preset's
own key names, and how many trials to run::

    preset: dqn_cartpole
    overrides: [collector.total_frames=20000]
    space:
      optim.lr: {low: 1.0e-4, high: 1.0e-3, log: true}
      optim.gamma: {choices: [0.99, 0.995]}
      replay.slice_len: {choices: [4, 8, 16]}
    objective: last        # a trial's value: its last or best evaluation return (maximized)
    trials: 20
    jobs: 2                # worker processes, each training one trial at a time
    pruner: median
    sweep_dir: runs/sweep-cartpole
    launcher: slurm        # the workers are SLURM jobs (default local: processes here)
    slurm: {profile: local, time_min: 120}   # train.py's slurm.* settings, but array

Every trial is a normal run directory, ``<sweep_dir>/trial-NNNN``, trained by
:func:`rl_app.run.train`. The study is an Optuna journal file in the sweep directory (a
seeded multivariate TPE sampler), so running the command again continues it. After each
evaluation a trial reports its return; a pruned trial stops there with a checkpoint.

A worker claims a trial by locking ``<sweep_dir>/claims/<number>`` (:mod:`rl_app.runlock`)
for as long as it trains it. The journal storage has no heartbeat: a killed worker's trial
stays RUNNING, and its claim is what tells. The next worker to start takes over every
RUNNING trial whose claim no live process holds, with the same settings: its run directory
resumes from its newest checkpoint, so no trial is lost and none is counted twice.

With ``launcher: slurm`` the command checks the ``slurm:`` settings against the cluster,
submits ``jobs`` worker jobs (:class:`rl_app.launch.job.WorkerJob`, each running
:func:`rl_app.sweep.worker.work_in_job`: the trials, then the summary) and returns, as
``train.py launcher=slurm`` does. A USR2 stops a worker's trial at an iteration boundary
with a checkpoint and requeues the job, which resumes the trial; the worker that finds
nothing left writes the summary.

One module per job, each importing only those above it:

- :mod:`rl_app.sweep.spec`: the sweep file (its keys, the search space, the checks) and
  the layout of a sweep directory;
- :mod:`rl_app.sweep.study`: the Optuna study, the claims on trials, one trial trained;
- :mod:`rl_app.sweep.summary`: ``summary.md``, ``trials.csv``, ``best.yaml`` and the plots;
- :mod:`rl_app.sweep.worker`: the workers (processes here, or SLURM jobs), the signals
  passed on to them;
- :mod:`rl_app.sweep.__main__`: the command.

A new key of the sweep file is a field of :class:`~rl_app.sweep.spec.SweepSettings` (with
its doc line and what it accepts; the command's ``--help`` lists it); a new kind of search
dimension is a branch of :func:`~rl_app.sweep.spec.distribution`; a new pruner, a branch of
:func:`~rl_app.sweep.study.make_pruner`; a new launcher, a function beside
:func:`~rl_app.sweep.worker.run_sweep` and :func:`~rl_app.sweep.worker.submit_to_slurm`,
chosen in :func:`~rl_app.sweep.__main__.main`.
"""
