"""What the flow-matching VLAs (SmolVLA, pi0, pi0.5) share: the helpers of their token streams
and the policy methods around a model with ``sample_actions(images, masks, tokens, token_mask,
state, noise=)``.

A policy built on :class:`FlowMatchingPolicy` defines ``_inputs(batch)`` (the model's inputs:
frames, their masks, the prompt's tokens and mask, the state) and ``self.model``; it gets the
action queue (``reset``, ``select_action``), chunk prediction from fixed noise, LeRobot's one
optimizer group, and training draws that come from the caller, else from the sample keys.
"""

from __future__ import annotations

import math
from collections import deque

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from lerobot_pipe.configs.types import ACTION, OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS
from lerobot_pipe.policies.pretrained import PreTrainedPolicy


def pad_last_dim(x: Tensor, width: int) -> Tensor:
    """Zero-pad the last dimension to ``width`` (unchanged when already as wide)."""
    return x if x.shape[-1] >= width else F.pad(x, (0, width - x.shape[-1]))


def time_embedding(t: Tensor, dim: int, min_period: float, max_period: float) -> Tensor:
    """Sine-cosine embedding (B, dim) of the flow time ``t`` (B,), periods geometric between
    ``min_period`` and ``max_period``, computed in float64 (float32 on MPS)."""
    if dim % 2:
        raise ValueError(f"the time embedding's width must be even, got {dim}")
    dtype = torch.float32 if t.device.type == "mps" else torch.float64
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=dtype, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = (1.0 / period * 2 * math.pi)[None, :] * t[:, None]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)


def attention_2d(pad: Tensor, blocks: Tensor) -> Tensor:
    """(B, L, L) bool: token i sees token j when both are real (``pad``) and j's block number
    (cumulative ``blocks``) is at most i's: a block-causal prefix-LM mask."""
    cumulative = torch.cumsum(blocks, dim=1)
    return (cumulative[:, None, :] <= cumulative[:, :, None]) & (pad[:, None, :] & pad[:, :, None])


class FlowMatchingPolicy(PreTrainedPolicy):
    """The methods SmolVLA, pi0 and pi0.5 share (module docstring). An intermediate base: it
    registers no policy type."""

    def get_optim_params(self) -> list[dict]:
        """LeRobot's: every parameter in one group (the frozen ones get no gradient, hence no
        optimizer state), so optimizer files number the parameters as LeRobot's do."""
        return [{"params": list(self.parameters())}]

    def reset(self) -> None:
        """Empty the action queue (call at each episode start)."""
        self._queues = {ACTION: deque(maxlen=self.config.n_action_steps)}

    def _language(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """The prompt's tokens and mask (the preprocessor's tokenizer step writes them)."""
        for key in (OBS_LANGUAGE_TOKENS, OBS_LANGUAGE_ATTENTION_MASK):
            if key not in batch:
                raise KeyError(
                    f"the batch has no {key!r}: {self.config.type}'s preprocessor tokenizes the "
                    "'task' strings (tokenizer_processor)"
                )
        return batch[OBS_LANGUAGE_TOKENS], batch[OBS_LANGUAGE_ATTENTION_MASK]

    def _inputs(self, batch: dict[str, Tensor]) -> tuple:
        raise NotImplementedError

    def _training_draws(
        self, batch: dict[str, Tensor], shape: tuple[int, ...], device: torch.device
    ) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def _draws(
        self, batch: dict[str, Tensor], actions: Tensor, noise: Tensor | None, time: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """The given noise and time, what is missing drawn (``_training_draws``)."""
        if noise is None or time is None:
            drawn_noise, drawn_time = self._training_draws(
                batch, tuple(actions.shape), actions.device
            )
            noise = drawn_noise if noise is None else noise
            time = drawn_time if time is None else time
        return noise, time

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Tensor], noise: Tensor | None = None) -> Tensor:
        """(B, chunk_size, action_dim) normalized actions; ``noise`` (B, chunk_size,
        max_action_dim) fixes the sampler's start. Switches to eval mode."""
        self.eval()
        actions = self.model.sample_actions(*self._inputs(batch), noise=noise)
        return actions[:, :, : self.config.action_feature["shape"][0]]

    @torch.no_grad()
    def select_action(self, batch: dict[str, Tensor], noise: Tensor | None = None) -> Tensor:
        """The next normalized action (B, action_dim): a new chunk is predicted when the queue
        of ``n_action_steps`` actions is empty. Call ``reset`` at each episode start."""
        self.eval()
        if not self._queues[ACTION]:
            chunk = self.predict_action_chunk(batch, noise=noise)
            self._queues[ACTION].extend(chunk.transpose(0, 1)[: self.config.n_action_steps])
        return self._queues[ACTION].popleft()
