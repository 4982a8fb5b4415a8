"""The keys of stored and sampled records that the buffer's parts, the algorithms and the
collectors share."""

from __future__ import annotations

from rl_app.envs import FRAME_KEY

# The collector numbers every trajectory; slices are cut within one id.
TRAJECTORY_KEY = ("collector", "traj_ids")
# The writer stamps every stored transition with its slot.
SLOT_KEY = "index"
# Where an algorithm's update writes one new priority per sampled transition.
PRIORITY_KEY = "td_error"
# Steps of a sample the loss counts: the learning steps of a Sequence window inside its
# episode (rl_app.replay.sequences), the steps whose frame stacks were rebuilt whole
# (rl_app.replay.frames).
LOSS_MASK_KEY = "loss_mask"
# A transition is relabelled with the goal a later step achieved after its action (as
# Stable-Baselines3's HerReplayBuffer does): the goal that step's reward was for. Stored
# with every transition when relabelling is on.
NEXT_ACHIEVED_GOAL = ("next", "achieved_goal")
# An env observing frames (rl_app.replay.frames): what a slot stores of a step's
# observations, the newest frame of its next one.
NEXT_FRAME_KEY = ("next", FRAME_KEY)
