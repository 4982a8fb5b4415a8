"""Atari frames stored once: the replay buffer keeps each 84x84 frame in one slot, and the
learner's stacks of FRAME_STACK frames are rebuilt from neighbouring slots at sample time.

Each slot holds the frame its env output produced: a step's slot the newest frame of its
next observation (``("next", "frame")``), and a *reset slot*, written just before an
episode's first step, the episode's first frame. Frame ``p`` of an episode (0: the reset's)
then lies ``p`` slots after its reset slot, and the observation of step ``s`` ends with
frame ``s``, its next observation with frame ``s + 1``: both stacks come from the
FRAME_STACK + 1 slots up to the step's own, clamped at the reset slot, which repeats the
first frame as CatFrames pads an episode's first stacks. No frame is written twice, and no
slot waits for a later one: a step's slot is complete when it is written, the newest step
of each env included. A reset slot costs one slot per episode (about 0.5% of the buffer for
Breakout's 200-step random games, less for a trained agent's).

A reset slot carries its own trajectory id (:func:`reset_trajectory`), so it is a one-slot
trajectory, which the slice samplers (slices of two steps or more) never draw; its other
entries are zeros. Every slot of a window must hold the (trajectory, step) expected there:
where the ring buffer has overwritten the first slots of a trajectory, or trajectories of
several envs interleave, a stack that cannot be rebuilt whole is masked (``LOSS_MASK_KEY``:
the loss and the priorities skip that step), never filled with another episode's frames.

The buffer does both through a TorchRL buffer transform (:class:`StoredFrames`): its
inverse, run by ``extend``, adds the reset slots; its forward, run on each sample, rebuilds
the stacks.
"""

from __future__ import annotations

import torch
from tensordict import NestedKey, TensorDictBase
from torchrl.data import TensorStorage
from torchrl.envs import Transform

from rl_app.envs import FRAME_KEY, FRAME_STACK, PIXELS_KEY
from rl_app.replay.keys import LOSS_MASK_KEY, NEXT_FRAME_KEY, SLOT_KEY, TRAJECTORY_KEY

# The step of the episode each slot holds: the reset slot is RESET_STEP, the first step 0.
STEP_KEY = "step_count"
RESET_STEP = -1
# The slots of a step's two stacks, back from its own: the observation's are the first
# FRAME_STACK, the next observation's the last FRAME_STACK.
WINDOW = torch.arange(-FRAME_STACK, 1)


def frame_replay_keys(loss_keys: list) -> list:
    """What the buffer stores for a loss reading ``loss_keys``: its stacks replaced by the
    newest frame and the step in the episode, from which they are rebuilt."""
    stacks = (PIXELS_KEY, ("next", PIXELS_KEY))
    return [key for key in loss_keys if key not in stacks] + [NEXT_FRAME_KEY, STEP_KEY]


def reset_trajectory(trajectory: torch.Tensor) -> torch.Tensor:
    """The trajectory id of the reset slot of trajectory ``trajectory`` (collector ids are
    never negative, so no trajectory takes it)."""
    return -1 - trajectory


class StoredFrames(Transform):
    """The buffer transform of frames stored once in ``storage``: ``extend`` hands its
    inverse collected steps with their observation's newest frame (``FRAME_KEY``), which it
    stores in reset slots (:func:`with_reset_slots`); each sample gets its stacks
    (:func:`stack_frames`), unless ``stack_samples`` is off: the buffer then rebuilds only
    the stacks it keeps of a sample (n-step transitions, :mod:`rl_app.replay.nstep`)."""

    def __init__(self, storage: TensorStorage, stack_samples: bool = True) -> None:
        super().__init__()
        self.storage = storage
        self.stack_samples = stack_samples

    def _inv_call(self, steps: TensorDictBase) -> TensorDictBase:
        return with_reset_slots(steps.exclude(FRAME_KEY), steps[FRAME_KEY])

    def forward(self, sample: TensorDictBase) -> TensorDictBase:
        return stack_frames(self.storage, sample) if self.stack_samples else sample


def with_reset_slots(steps: TensorDictBase, frames: torch.Tensor) -> TensorDictBase:
    """``steps`` with a reset slot before each episode's first step, holding ``frames`` of
    that step (its observation's newest frame, the episode's first)."""
    starts = steps[STEP_KEY].reshape(-1) == 0
    resets = steps[starts].clone().zero_()
    resets[NEXT_FRAME_KEY] = frames[starts]
    resets[TRAJECTORY_KEY] = reset_trajectory(steps[TRAJECTORY_KEY][starts])
    resets[STEP_KEY].fill_(RESET_STEP)
    # Each step moves down by the episode starts up to it; its reset slot goes just above.
    position = torch.arange(len(steps)) + starts.cumsum(0)
    order = torch.cat([position, position[starts] - 1]).argsort()
    return torch.cat([steps, resets])[order]


def stack_frames(storage: TensorStorage, sample: TensorDictBase) -> TensorDictBase:
    """Give ``sample`` (of any shape, drawn from ``storage``) its stacks, ``PIXELS_KEY``
    and ``("next", PIXELS_KEY)``, rebuilt from the frames in ``storage``, and mark the
    steps whose stacks were found whole under ``LOSS_MASK_KEY``."""
    steps = sample.reshape(-1)
    step = steps[STEP_KEY].reshape(-1, 1).to(storage.device)
    trajectory = steps[TRAJECTORY_KEY].reshape(-1, 1).to(storage.device)
    back = torch.maximum(WINDOW.to(storage.device), -1 - step)  # not before the reset slot
    slots = (steps[SLOT_KEY].reshape(-1, 1).to(storage.device) + back) % storage.max_size
    written = slots < len(storage)
    stored = storage.get(slice(0, len(storage)))  # views of the files, nothing read yet
    read = slots.where(written, 0).reshape(-1)

    def window(key: NestedKey) -> torch.Tensor:
        # index_select copies whole rows: several times faster than indexing with [].
        column = torch.index_select(stored.get(key), 0, read)
        return column.reshape(*slots.shape, *column.shape[1:])

    # Each slot must hold the step of the episode expected there, RESET_STEP its reset slot.
    expected_step = step + back
    owner = trajectory.where(expected_step > RESET_STEP, reset_trajectory(trajectory))
    whole = written & (window(TRAJECTORY_KEY) == owner)
    whole &= window(STEP_KEY).squeeze(-1) == expected_step
    # One read of every window's frames: both stacks are views of it.
    frames = window(NEXT_FRAME_KEY).to(sample.device)
    stack_shape = (*sample.shape, FRAME_STACK, *frames.shape[-2:])
    sample[PIXELS_KEY] = frames[:, :-1].reshape(stack_shape)
    sample["next", PIXELS_KEY] = frames[:, 1:].reshape(stack_shape)
    sample[LOSS_MASK_KEY] = whole.all(dim=1).reshape(sample.shape).to(sample.device)
    return sample


def random_shift(pixels: torch.Tensor, pad: int) -> torch.Tensor:
    """``pixels`` (``[..., channels, height, width]``) shifted by up to ``pad`` pixels in
    each direction, independently for each image of the batch (its channels together):
    padded by ``pad`` with its edge pixels repeated, then cropped back to its size at a
    random offset. DrQ's augmentation (Yarats et al., 2021; Dopamine's ``DrQ_eps``)."""
    batch_shape, (channels, height, width) = pixels.shape[:-3], pixels.shape[-3:]
    images = pixels.reshape(-1, channels, height, width)
    offsets = pad + torch.randint(-pad, pad + 1, (len(images), 2), device=pixels.device)
    padded = torch.nn.functional.pad(images, (pad, pad, pad, pad), mode="replicate")
    padded_height, padded_width = height + 2 * pad, width + 2 * pad
    # Each output row is a span of ``width`` bytes of the padded images: one row copy each
    # (index_select) instead of a gather per pixel.
    image_rows = torch.arange(len(images) * channels, device=pixels.device) * padded_height
    rows = (
        image_rows.reshape(-1, channels, 1)
        + offsets[:, :1, None]
        + torch.arange(height, device=pixels.device)
    )
    starts = rows * padded_width + offsets[:, 1:, None]
    spans = padded.reshape(-1).unfold(0, width, 1)  # every span of width pixels, a view
    shifted = spans.index_select(0, starts.reshape(-1))
    return shifted.reshape(*batch_shape, channels, height, width)
