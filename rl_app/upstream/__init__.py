"""Every private name of a dependency, and every workaround of one of its behaviours: one
module per library; nothing else in ``rl_app`` or ``tools``, and in ``tests`` only the tests
of these workarounds, reaches a private attribute or module of a dependency
(``tests/test_layout.py`` checks it).

Whoever upgrades a dependency reads its module here first. Each item says what the library
does, what is done here instead, and names the test (in ``tests/test_upstream.py``, or
``tests/test_ray.py`` for Ray's) that starts failing (or can be deleted) once the library
changes that behaviour.

- :mod:`rl_app.upstream.torchrl`: TorchRL 0.14.1, what every run needs (the Gymnasium env
  inside a TorchRL env, a collector's next step, the thread count a closing batch of envs
  sets, SACLoss's lazily created buffer, lazy storages, priority trees kept on the CPU, a
  replay buffer's and a sampler's state without its data, the prioritized slice sampler's
  slice starts recomputed over the buffer after every
  extend, the bytes a buffer keeps per slot, a saved checkpoint's metadata). An optional
  feature's TorchRL workarounds are in a module of their own, which only that feature
  imports:
- :mod:`rl_app.upstream.torchrl_workers`: weight pushes to worker processes;
  ``collector.mode=sync|async`` only.
- :mod:`rl_app.upstream.torchrl_collectors`: the distributed collector on submitit and the
  random warm-up it splits among workers, the RPC collector on local processes and SLURM
  jobs; ``collector.mode=distributed|rpc|ray`` only.
- :mod:`rl_app.upstream.torchrl_sequences`: an LSTM unrolled over sequences (recurrent
  networks).
- :mod:`rl_app.upstream.torchrl_hindsight`: HERReplayBuffer's hooks (``replay.her_ratio``).
- :mod:`rl_app.upstream.ray`: Ray 2.60.0 with TorchRL 0.14.1's ``RayCollector`` (which actor
  stopped, a collector actor's truth, warnings that do not apply, an endless collector, the
  random warm-up of actors sharing a buffer, a replay buffer owned by a Ray actor, a
  collector actor replaced);
  imported by ``collector.mode=ray`` only.
- :mod:`rl_app.upstream.torch`: torch 2.14.1 (how inductor splits a compiled loss, its
  CUDA_HOME warning on machines without CUDA, FLOPs counted as they run).
- :mod:`rl_app.upstream.tensordict`: tensordict 0.14.3 (recompiles caused by its class
  memo, a search for pandas on every module output, a deprecation warning it triggers).
- :mod:`rl_app.upstream.gymnasium`: Gymnasium 1.4 (a time limit's step count).
- :mod:`rl_app.upstream.optuna`: Optuna 5.0.0 (a stored trial taken up again).
- :mod:`rl_app.upstream.glibc`: glibc's malloc (freed memory kept for reuse).
- :mod:`rl_app.upstream.pytest`: pytest 9.2.0 with pytest-xdist 3.8.0 (tests grouped onto
  one worker); only the test suite imports it.
"""
