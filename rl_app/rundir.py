"""The layout of a run directory: the names of what a run keeps in it."""

CONFIG_FILE = "config.yaml"
CHECKPOINTS_DIR = "checkpoints"
REPLAY_DIR = "replay"  # the replay buffer's memory-mapped files
JOURNAL_DIR = "replay-journal"  # what restores those files to a checkpoint's state
LOCK_FILE = ".lock"  # held by the process training in it (rl_app.runlock)
HOLDER_FILE = ".lock.holder"  # who holds it
