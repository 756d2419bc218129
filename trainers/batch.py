"""Trajectories as padded tensors: the :class:`Batch` the trainer's functions read.

:func:`collate` right-pads a list of :class:`~agentrl.types.Trajectory` into ``[B, T]`` tensors
aligned with the token ids: position ``t`` of every per-token tensor describes token ``t``
(its behaviour log-prob given the tokens before it, the policy version that made it, the reward
placed on it). Padding positions have ``loss_mask`` 0, like prompt and observation tokens, so every
loss that is masked by ``loss_mask`` ignores them. A trajectory's reference answer
(``Trajectory.reference_ids``, JEPO) follows its tokens in the row, with ``loss_mask`` 0 and
``reference_mask`` 1 on the reply's own tokens.

A :class:`Batch` is cut into micro-batches with :meth:`Batch.split` (or :meth:`Batch.select`)
without renumbering anything: ``group_index`` keeps the numbering of the whole batch, so compute
group-level advantages on the whole batch first, attach them (``dataclasses.replace(batch,
advantages=...)``), then split. The fields after ``group_ids`` are what a trainer attaches before
its update (None until then); every tensor field is carried along by ``split``, ``select`` and ``to``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from agentrl.types import Trajectory


@dataclass
class Batch:
    """A right-padded batch of ``B`` trajectories, ``T`` tokens long.

    >>> t = Trajectory(token_ids=[5, 6, 7], loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.25],
    ...                versions=[-1, 3, 3], prompt_length=1, turn_ends=[2], turn_rewards=[1.0],
    ...                reward=1.0, group_id="g")
    >>> batch = collate([t], pad_token_id=0, pad_to_multiple_of=4)
    >>> batch.input_ids.tolist(), batch.token_rewards.tolist(), batch.num_tokens
    ([[5, 6, 7, 0]], [[0.0, 0.0, 1.0, 0.0]], 2)
    >>> batch.turn_index.tolist()
    [[-1, 0, 0, -1]]
    """

    input_ids: torch.Tensor
    """``[B, T]`` long: the token ids, right-padded with the pad token."""
    attention_mask: torch.Tensor
    """``[B, T]`` long: 1 on real tokens, 0 on padding."""
    loss_mask: torch.Tensor
    """``[B, T]`` float: 1 exactly on generated tokens (0 on prompt, observation and padding)."""
    behaviour_logprobs: torch.Tensor
    """``[B, T]`` float: the inference engine's log-prob of each generated token (0 elsewhere)."""
    token_rewards: torch.Tensor
    """``[B, T]`` float: each turn's reward on the last generated token of the turn (PPO / GAE)."""
    rewards: torch.Tensor
    """``[B]`` float: the episode returns (GRPO, RLOO)."""
    group_index: torch.Tensor
    """``[B]`` long: ``0..G-1``, equal for trajectories that share a ``group_id``, numbered in order
    of first appearance."""
    versions: torch.Tensor
    """``[B, T]`` long: the policy version that generated each token (-1 where none)."""
    lengths: torch.Tensor
    """``[B]`` long: each trajectory's length before padding (its reference answer included)."""
    turn_index: torch.Tensor
    """``[B, T]`` long: the turn of each generated token, ``0..K-1`` (turn ``k`` is the generated
    tokens after ``turn_ends[k-1]`` up to ``turn_ends[k]``); -1 on prompt, observation and padding
    tokens, and on generated tokens after the last turn end (recorded trajectories have none).
    Turn-level returns (``returns="turn"``) read it with ``token_rewards``."""
    group_ids: tuple[str, ...] = ()
    """The ``group_id`` string of each group index (``group_ids[group_index[i]]``)."""
    reference_mask: torch.Tensor | None = None
    """``[B, T]`` float: 1 on the tokens of a reference answer appended after the trajectory
    (``Trajectory.reference_ids`` where ``reference_mask`` is 1), 0 elsewhere; None when no
    trajectory of the batch has one."""
    turn_states: torch.Tensor | None = None
    """``[B, K]`` long: each turn's state (``Trajectory.turn_states``) as a number, equal numbers for
    equal keys across the batch; -1 past a trajectory's turns or where it recorded no states (GiGPO)."""
    # What the trainer attaches before its update, each [B, T] and 0 off generated tokens.
    old_logprobs: torch.Tensor | None = None
    """The policy's log-probs before the update, when the batch feeds several updates (PPO epochs,
    mini-batches); None means the current ones, detached."""
    ref_logprobs: torch.Tensor | None = None
    """The frozen reference model's log-probs (the KL term)."""
    values: torch.Tensor | None = None
    """The critic's values before the update (PPO)."""
    advantages: torch.Tensor | None = None
    """Each generated token's advantage (:func:`agentrl.trainers.advantages.estimate_advantages`)."""
    returns: torch.Tensor | None = None
    """The critic's targets (PPO: GAE's returns)."""
    reference_weights: torch.Tensor | None = None
    """``[B]``: the weight of each trajectory's reference answer in JEPO's supervised term."""

    def __len__(self) -> int:
        """The number of trajectories ``B``."""
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        """How many tokens carry a loss (the sum of ``loss_mask``)."""
        return int(self.loss_mask.sum().item())

    @property
    def num_reference_tokens(self) -> int:
        """How many reference-answer tokens the batch scores (the sum of ``reference_mask``)."""
        return 0 if self.reference_mask is None else int(self.reference_mask.sum().item())

    @property
    def num_seqs(self) -> int:
        """How many trajectories have at least one generated token: the sequence count that
        :func:`agentrl.trainers.losses.aggregate` divides by in its ``seq-mean-*`` modes."""
        return int((self.loss_mask.sum(dim=-1) > 0).sum().item())

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
        """A new batch with ``fn`` applied to every tensor field (fields that are None stay None)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **{n: fn(v) for n, v in values.items() if isinstance(v, torch.Tensor)})

    def to(self, device: torch.device | str) -> Batch:
        """The same batch with every tensor (the trainer's fields included) on ``device``."""
        return self._map(lambda tensor: tensor.to(device))

    def select(self, indices: Sequence[int] | torch.Tensor) -> Batch:
        """The trajectories at ``indices``, in that order, as a new batch of the same length ``T``.

        ``group_index`` and ``group_ids`` keep the whole batch's numbering; the trainer's fields
        are selected too.
        """
        index = torch.as_tensor(indices, dtype=torch.long, device=self.input_ids.device)
        if index.ndim != 1:
            raise ValueError(f"select takes a 1-D list of row indices, got shape {tuple(index.shape)}.")
        if index.numel() and (int(index.min()) < -len(self) or int(index.max()) >= len(self)):
            raise IndexError(f"select got indices {index.tolist()} for a batch of {len(self)} trajectories.")
        return self._map(lambda tensor: tensor.index_select(0, index.to(tensor.device)))

    def split(self, micro_batch_size: int) -> list[Batch]:
        """Consecutive micro-batches of ``micro_batch_size`` trajectories (the last may be smaller).

        Micro-batches keep the full length ``T``, so a loss aggregated with the whole batch's
        counts (``aggregate(..., num_tokens=batch.num_tokens, num_seqs=batch.num_seqs)``) sums
        over the micro-batches to the whole batch's loss.
        """
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be at least 1, got {micro_batch_size}.")
        return [
            self.select(range(start, min(start + micro_batch_size, len(self))))
            for start in range(0, len(self), micro_batch_size)
        ]


def collate(
    trajectories: Sequence[Trajectory],
    pad_token_id: int,
    *,
    pad_to_multiple_of: int | None = None,
) -> Batch:
    """Right-pad ``trajectories`` into a :class:`Batch`.

    Each trajectory is validated first (:meth:`Trajectory.validate`), and its ``turn_ends`` must
    point at generated tokens, in increasing order, since that is where the turn rewards are
    placed (a reward on a token without loss would never reach the loss) and what numbers each
    generated token's turn (``turn_index``). ``pad_to_multiple_of`` rounds ``T`` up (to
    keep tensor shapes few, for kernels and compiled graphs).

    Raises:
        ValueError: for an empty list, a malformed trajectory (its index and group are named), or a
            ``pad_to_multiple_of`` below 1.
    """
    if not trajectories:
        raise ValueError("collate got no trajectories; give at least one to make a batch.")
    if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
        raise ValueError(f"pad_to_multiple_of must be at least 1 or None, got {pad_to_multiple_of}.")
    for i, trajectory in enumerate(trajectories):
        _check(i, trajectory)

    lengths = [len(t.token_ids) + len(t.reference_ids) for t in trajectories]
    width = max(lengths)
    if pad_to_multiple_of is not None:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    batch_size = len(trajectories)

    input_ids = torch.full((batch_size, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch_size, width), dtype=torch.long)
    loss_mask = torch.zeros((batch_size, width), dtype=torch.float32)
    behaviour_logprobs = torch.zeros((batch_size, width), dtype=torch.float32)
    token_rewards = torch.zeros((batch_size, width), dtype=torch.float32)
    versions = torch.full((batch_size, width), -1, dtype=torch.long)
    turn_index = torch.full((batch_size, width), -1, dtype=torch.long)
    group_numbers: dict[str, int] = {}
    group_index = []
    most_turns = max((len(t.turn_ends) for t in trajectories), default=0)
    turn_states = torch.full((batch_size, most_turns), -1, dtype=torch.long)
    state_numbers: dict[str, int] = {}
    references = any(t.reference_ids for t in trajectories)
    reference_mask = torch.zeros((batch_size, width), dtype=torch.float32) if references else None
    for row, trajectory in enumerate(trajectories):
        n, total = len(trajectory.token_ids), lengths[row]
        input_ids[row, :n] = torch.tensor(trajectory.token_ids, dtype=torch.long)
        attention_mask[row, :total] = 1
        loss_mask[row, :n] = torch.tensor(trajectory.loss_mask, dtype=torch.float32)
        behaviour_logprobs[row, :n] = torch.tensor(trajectory.logprobs, dtype=torch.float32)
        versions[row, :n] = torch.tensor(trajectory.versions, dtype=torch.long)
        if reference_mask is not None and trajectory.reference_ids:
            input_ids[row, n:total] = torch.tensor(trajectory.reference_ids, dtype=torch.long)
            reference_mask[row, n:total] = torch.tensor(trajectory.reference_mask, dtype=torch.float32)
        start = 0
        for turn, (end, reward) in enumerate(zip(trajectory.turn_ends, trajectory.turn_rewards, strict=True)):
            token_rewards[row, end] += reward
            turn_index[row, start : end + 1] = turn
            start = end + 1
        group_index.append(group_numbers.setdefault(trajectory.group_id, len(group_numbers)))
        for turn, key in enumerate(trajectory.turn_states):
            turn_states[row, turn] = state_numbers.setdefault(key, len(state_numbers))

    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        behaviour_logprobs=behaviour_logprobs,
        token_rewards=token_rewards,
        rewards=torch.tensor([float(t.reward) for t in trajectories], dtype=torch.float32),
        group_index=torch.tensor(group_index, dtype=torch.long),
        versions=versions,
        lengths=torch.tensor(lengths, dtype=torch.long),
        turn_index=torch.where(loss_mask > 0, turn_index, -1),
        group_ids=tuple(group_numbers),
        reference_mask=reference_mask,
        turn_states=turn_states,
    )


def _check(index: int, trajectory: Trajectory) -> None:
    where = f"Trajectory {index} (group_id {trajectory.group_id!r})"
    try:
        trajectory.validate()
    except ValueError as e:
        raise ValueError(f"{where} is malformed: {e}") from e
    n = len(trajectory.token_ids)
    if n == 0:
        raise ValueError(f"{where} has no tokens; drop empty trajectories before collating.")
    for turn, end in enumerate(trajectory.turn_ends):
        if turn and end <= trajectory.turn_ends[turn - 1]:
            raise ValueError(
                f"{where}: turn_ends {trajectory.turn_ends} do not increase; turn_ends must index the last "
                "generated token of each turn, in the order of the turns."
            )
        if not 0 <= end < n:
            raise ValueError(
                f"{where}: turn_ends[{turn}] = {end} is outside its {n} tokens; turn_ends must index "
                "the last generated token of each turn."
            )
        if trajectory.loss_mask[end] != 1:
            raise ValueError(
                f"{where}: turn_ends[{turn}] = {end} points at a token with loss_mask 0, so the turn's "
                "reward would never reach the loss; turn_ends must index the last generated token of "
                "each turn."
            )
