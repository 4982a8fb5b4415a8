"""``make bench`` (``python -m tools.bench``): measured speed, written to ``bench.json``.

Sections (``--only update,training,...`` picks some), measured one after the other, each in
a module of its own (:mod:`tools.bench.machine`, ``.update``, ``.training``,
``.checkpoint``, ``.pixels``, ``.collection``, ``.replay_service``, ``.overlap``,
``.evaluation``, ``.sb3``, ``.gpu``;
what several share is in :mod:`tools.bench.shared`, the command in :mod:`tools.bench.__main__`):
- machine: platform, cores, versions, and the measured float32 matmul rate of one thread;
- update: one SAC update step of the default preset in each of ``UPDATE_VARIANTS`` (each
  speed lever alone, together, the compiled loss with our forward/backward split and with
  inductor's, and each value target), interleaved,
  next to its FLOP bound (the matrix-product FLOPs the update runs, counted as it runs, at
  the measured matmul rate), and the same update in fresh processes with glibc's
  allocator and with jemalloc;
- training: the default preset with a 1e6-capacity memmap buffer (shortened to
  ``BENCH_FRAMES`` frames unless overridden with ``ARGS="collector.total_frames=..."``):
  environment frames/s, updates/s and the mean time per iteration of each phase of the
  loop, with prioritized slice sampling + priority writes as a share of the iteration;
- checkpoint: save, verify-and-load time and size with a 100k-transition Pendulum buffer,
  and checkpointing's share of training time at the default evaluation interval;
- pixels: the ``dqn_atari`` preset at its 1M-slot capacity, its buffer filled from recorded
  Atari play: disk per stored transition, the learner's memory (RssAnon, RssFile) while
  sampling, batches/s of 32 stacked observation pairs (the loop's sampling, with and
  without the stacks), one Nature-CNN update on the CPU (and the Atari-100k preset's
  updates at that speed), checkpoint save, verify and load with the undo journal and its
  disk per evaluation interval, next to a whole copy of the buffer with its SHA-256;
- collection: frames/s of the direct, sync and async collectors (1 and 2 workers) and of
  1 and 2 SLURM collection jobs (distributed, when SLURM is here) acting with the SAC
  actor, next to the raw Gymnasium step rate of the same env (the ceiling),
  and each mode's end-to-end training frames/s at the default update-to-data ratio;
- replay_service: the replay buffer in the learner's process next to the Ray replay service
  (``replay.service=ray``), both fed by two asynchronous Ray collector actors: frames/s
  collected into it, batches/s the learner samples from it, and their ratios;
- overlap: ``replay.prefetch`` and async collection in one worker process, alone and
  together, against neither, interleaved, for ``default`` and ``dqn_atari100k`` in short
  runs: frames/s over the loop, the time spent collecting, waiting for batches and
  updating, and each run's last metrics row (what it learned);
- evaluation: ``eval.backend=blocking`` against ``process`` for ``default`` and
  ``dqn_atari100k`` in short runs that evaluate along the way: wall time, the time training
  waited for evaluations, the evaluation rows and the last row;
- sb3: the same SAC workload as Stable-Baselines3 (``SB3_WORKLOAD``; ours with async
  collection and the compiled loss), run interleaved
  (ours, SB3, ours, SB3), each final agent scored on the same 10 fixed reset seeds; medians
  and the wall-time ratio. SB3 runs in its own virtual environment (``.venv-sb3``);
- gpu (on a machine with CUDA): ``sac_halfcheetah`` at one update per frame, eager,
  compiled, and compiled with CUDA graphs (also with the replay data on the GPU), beside
  Stable-Baselines3's SAC with the same settings on the same GPU; and
  ``dqn_atari`` and ``dqn_atari100k`` in a short run each: frames/s, ms per update.

A new benchmark is a module with a ``bench_<name>`` function (measuring, returning what it
measured as a JSON-able dict) and a ``print_<name>`` function (showing that dict), both
named in ``SECTIONS`` in :mod:`tools.bench.__main__`. A benchmark uses the package as a
user's code would: ``rl_app.run.train`` (a run's phase times are in its result's
``seconds_per_phase``, whatever phases the loop has), ``rl_app.run.build_run`` for the parts
of a run (the :class:`rl_app.loop.Run` it returns), ``rl_app.loop.updates_per_iteration``
(the updates each collected batch gets), and the factories; never the loop's own steps.

Not part of the test suite: timings depend on the machine and on what else runs on it.
"""
