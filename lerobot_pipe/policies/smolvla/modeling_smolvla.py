"""SmolVLA: a SmolVLM prefix (frames, task tokens, state) and an action expert that turns noise
into an action chunk by flow matching; LeRobot 0.6.1's weights, loss and sampler.

Training (``forward``): for actions ``a`` (zero-padded to ``max_action_dim``), noise ``n`` and a
time ``t`` in (0.001, 1] (0.999 * Beta(1.5, 1) + 0.001), the expert sees
``x_t = t n + (1 - t) a`` and regresses the velocity ``n - a`` (MSE over the real action
dimensions and the non-padded steps). Sampling integrates the predicted velocity from ``t = 1``
(noise shaped (B, chunk_size, max_action_dim)) to 0 in ``num_steps`` Euler steps, over a
key/value cache of the prefix.

Training randomness (noise and time) is drawn per sample from ``batch["sample_key"]``
(:mod:`lerobot_pipe.utils.random`) when the batch has one and none is passed, so a
data-parallel run computes what one process computes; otherwise from torch's RNG, as LeRobot's.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from lerobot_pipe.constants import SAMPLE_KEY
from lerobot_pipe.policies.flow_matching import (
    FlowMatchingPolicy,
    attention_2d,
    pad_last_dim,
    time_embedding,
)
from lerobot_pipe.policies.pretrained import ACTION, OBS_STATE
from lerobot_pipe.policies.smolvla.configuration_smolvla import SmolVLAConfig
from lerobot_pipe.policies.smolvla.processor_smolvla import (
    load_tokenizer,
)
from lerobot_pipe.policies.smolvla.vlm_expert import SmolVLMWithExpert, vlm_weight_files
from lerobot_pipe.utils.random import keyed_normal, keyed_uniform, stream_id

ACTION_IS_PAD = "action_is_pad"
NOISE_STREAM = stream_id("smolvla.noise")
TIME_STREAM = stream_id("smolvla.time")
# Flow time: 0.999 * Beta(1.5, 1) + 0.001.
TIME_ALPHA, TIME_SCALE, TIME_OFFSET = 1.5, 0.999, 0.001


def resize_with_pad(img: Tensor, height: int, width: int, pad_value: float = 0.0) -> Tensor:
    """(B, C, h, w) -> (B, C, height, width): bilinear resize keeping the aspect ratio, then
    padding on the left and top (SmolVLA's convention)."""
    h, w = img.shape[-2:]
    if (h, w) == (height, width):
        return img
    ratio = max(w / width, h / height)
    new_h, new_w = int(h / ratio), int(w / ratio)
    img = F.interpolate(img, size=(new_h, new_w), mode="bilinear", align_corners=False)
    return F.pad(img, (max(0, width - new_w), 0, max(0, height - new_h), 0), value=pad_value)


def _pad_sequence(x: Tensor, length: int) -> Tensor:
    """Zero-pad dimension 1 to ``length``."""
    out = x.new_zeros((x.shape[0], length, *x.shape[2:]))
    out[:, : x.shape[1]] = x
    return out


class VLAFlowMatching(nn.Module):
    """The VLM with its expert (``vlm_with_expert``) and the five projections around them."""

    def __init__(self, config: SmolVLAConfig, *, build_weights: bool = True) -> None:
        super().__init__()
        self.config = config
        self.vlm_with_expert = SmolVLMWithExpert(
            config.vlm_model_name,
            load_vlm_weights=config.load_vlm_weights,
            build_weights=build_weights,
            train_expert_only=config.train_expert_only,
            freeze_vision_encoder=config.freeze_vision_encoder,
            attention_mode=config.attention_mode,
            num_expert_layers=config.num_expert_layers,
            num_vlm_layers=config.num_vlm_layers,
            self_attn_every_n_layers=config.self_attn_every_n_layers,
            expert_width_multiplier=config.expert_width_multiplier,
        )
        hidden = self.vlm_with_expert.hidden_size
        expert = self.vlm_with_expert.expert_hidden_size
        self.state_proj = nn.Linear(config.max_state_dim, hidden)
        self.action_in_proj = nn.Linear(config.max_action_dim, expert)
        self.action_out_proj = nn.Linear(expert, config.max_action_dim)
        self.action_time_mlp_in = nn.Linear(2 * expert, expert)
        self.action_time_mlp_out = nn.Linear(expert, expert)
        self.state_proj.requires_grad_(config.train_state_proj)
        self._image_tokens: tuple[list[int], list[int]] | None = None
        self._state_row: int | None = None  # set by embed_prefix
        if config.add_image_special_tokens:
            tok = load_tokenizer(config.vlm_model_name)
            # Before each frame: <fake_token_around_image><global-img>; after: the fake token.
            self._image_tokens = (
                [tok.fake_image_token_id, tok.global_image_token_id],
                [tok.fake_image_token_id],
            )

    # --- token streams ----------------------------------------------------------------------

    def _special(self, ids: list[int], batch: int, device: torch.device) -> Tensor:
        tokens = torch.tensor(ids, dtype=torch.long, device=device)
        return self.vlm_with_expert.embed_tokens(tokens)[None].expand(batch, -1, -1)

    def embed_prefix(
        self,
        images: list[Tensor],
        image_masks: list[Tensor],
        tokens: Tensor,
        token_mask: Tensor,
        state: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(embeddings, pad mask, block starts) of frames, task tokens and state; frames and
        tokens form one block, the state starts the next."""
        vlm = self.vlm_with_expert
        parts, pads, blocks = [], [], []

        def add(embedding: Tensor, pad: Tensor, block: int) -> None:
            parts.append(embedding)
            pads.append(pad)
            blocks.extend([block] * embedding.shape[1])

        for image, image_mask in zip(images, image_masks, strict=True):
            b = image.shape[0]
            if self._image_tokens is not None:
                start = self._special(self._image_tokens[0], b, image.device)
                add(start, torch.ones(start.shape[:2], dtype=torch.bool, device=image.device), 0)
            emb = vlm.embed_image(image)
            emb = emb * torch.tensor(emb.shape[-1] ** 0.5, dtype=emb.dtype, device=emb.device)
            add(emb, image_mask[:, None].expand(-1, emb.shape[1]), 0)
            if self._image_tokens is not None:
                end = self._special(self._image_tokens[1], b, image.device)
                add(end, torch.ones(end.shape[:2], dtype=torch.bool, device=image.device), 0)
        words = vlm.embed_tokens(tokens)
        add(words * math.sqrt(words.shape[-1]), token_mask, 0)
        # Where the state token stands: the rows before it form a block that never attends to it.
        self._state_row = sum(part.shape[1] for part in parts)
        state_emb = self.state_proj(state.to(self.state_proj.weight.dtype))
        if state_emb.dim() == 2:
            state_emb = state_emb[:, None]
        add(state_emb, torch.ones(state_emb.shape[:2], dtype=torch.bool, device=state.device), 1)

        embeddings = torch.cat(parts, dim=1)
        pad = torch.cat(pads, dim=1)
        block = torch.tensor(blocks, dtype=torch.bool, device=pad.device)[None]
        if pad.shape[1] < self.config.prefix_length:
            length = self.config.prefix_length
            embeddings, pad = _pad_sequence(embeddings, length), _pad_sequence(pad, length)
            block = _pad_sequence(block, length)
        return embeddings, pad, block.expand(pad.shape[0], -1)

    def embed_suffix(self, noisy: Tensor, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(embeddings, pad mask, block starts) of the noisy chunk fused with the flow time;
        every action token starts its own block (causal among actions)."""
        # Each head reads its input in its own dtype (bf16 under FSDP2's mixed precision).
        actions = self.action_in_proj(noisy.to(self.action_in_proj.weight.dtype))
        width = self.vlm_with_expert.expert_hidden_size
        cfg = self.config
        times = time_embedding(t, width, cfg.min_period, cfg.max_period).to(actions.dtype)
        fused = torch.cat([actions, times[:, None].expand_as(actions)], dim=2)
        fused = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(fused)))
        b, n = fused.shape[:2]
        pad = torch.ones(b, n, dtype=torch.bool, device=fused.device)
        block = torch.ones(b, cfg.chunk_size, dtype=fused.dtype, device=fused.device)
        return fused, pad, block

    # --- loss and sampler ---------------------------------------------------------------------

    def _velocity(self, out: Tensor) -> Tensor:
        """The expert's output through ``action_out_proj``, in float32. The head reads it in its
        own dtype: float32 as LeRobot's (its head is float32), bf16 when FSDP2's mixed
        precision computes the root unit in bf16."""
        head = self.action_out_proj
        return head(out.to(head.weight.dtype)).float()

    def velocity_loss(
        self,
        images: list[Tensor],
        image_masks: list[Tensor],
        tokens: Tensor,
        token_mask: Tensor,
        state: Tensor,
        actions: Tensor,
        noise: Tensor,
        t: Tensor,
    ) -> Tensor:
        """Per-element squared error (B, chunk, max_action_dim) of the predicted velocity."""
        tt = t[:, None, None]
        x_t = tt * noise + (1 - tt) * actions
        prefix, prefix_pad, prefix_block = self.embed_prefix(
            images, image_masks, tokens, token_mask, state
        )
        suffix, suffix_pad, suffix_block = self.embed_suffix(x_t, t)
        pad = torch.cat([prefix_pad, suffix_pad], dim=1)
        mask = attention_2d(pad, torch.cat([prefix_block, suffix_block], dim=1))
        positions = torch.cumsum(pad, dim=1) - 1
        # The state token starts the prefix's second block (frames and task tokens: the first).
        first_live = self._state_row
        out = self.vlm_with_expert.forward_joint(prefix, suffix, mask, positions, first_live)
        velocity = self._velocity(out[:, -self.config.chunk_size :])
        return F.mse_loss(noise - actions, velocity, reduction="none")

    def sample_actions(
        self,
        images: list[Tensor],
        image_masks: list[Tensor],
        tokens: Tensor,
        token_mask: Tensor,
        state: Tensor,
        noise: Tensor | None = None,
    ) -> Tensor:
        """(B, chunk_size, max_action_dim) actions by Euler integration from ``noise``."""
        cfg = self.config
        b, device = state.shape[0], state.device
        if noise is None:
            noise = torch.randn(b, cfg.chunk_size, cfg.max_action_dim, device=device)
        prefix, prefix_pad, prefix_block = self.embed_prefix(
            images, image_masks, tokens, token_mask, state
        )
        cache = self.vlm_with_expert.encode_prefix(
            prefix, attention_2d(prefix_pad, prefix_block), torch.cumsum(prefix_pad, dim=1) - 1
        )
        offsets = prefix_pad.sum(dim=-1)[:, None]
        dt = -1.0 / cfg.num_steps
        x_t = noise
        for step in range(cfg.num_steps):
            t = torch.tensor(1.0 + step * dt, dtype=torch.float32, device=device).expand(b)
            suffix, suffix_pad, suffix_block = self.embed_suffix(x_t, t)
            s = suffix_pad.shape[1]
            mask = torch.cat(
                [
                    prefix_pad[:, None, :].expand(b, s, -1),
                    attention_2d(suffix_pad, suffix_block),
                ],
                dim=2,
            )
            positions = offsets + torch.cumsum(suffix_pad, dim=1) - 1
            out = self.vlm_with_expert.forward_suffix(cache, suffix, mask, positions)
            velocity = self._velocity(out[:, -cfg.chunk_size :])
            x_t = x_t + dt * velocity
        return x_t


class SmolVLAPolicy(FlowMatchingPolicy):
    """SmolVLA: training loss, chunk prediction and step-wise action selection.

    Batches are already normalized and tokenized: each camera ``observation.images.<name>``
    (B, 3, H, W) or (B, 1, 3, H, W) in [0, 1] (an optional ``<key>_padding_mask`` (B,) marks
    missing frames), ``observation.state`` (B, state_dim) or (B, 1, state_dim),
    ``observation.language.tokens`` / ``.attention_mask`` (B, L); for training ``action``
    (B, chunk_size, action_dim), ``action_is_pad`` (B, chunk_size) and the loader's
    ``sample_key`` (B,).
    """

    config_class = SmolVLAConfig
    name = "smolvla"
    # The vision tower's layers (their forward runs) and the VLM's and the expert's decoder
    # layers (their own forward never runs: their work runs through their unit entries,
    # vlm_expert.py).
    _fsdp_wrap_modules = ["SmolVLMEncoderLayer", "LlamaDecoderLayer"]
    # LeRobot's default SmolVLA LoRA targets: the expert's q/v projections and the five heads
    # (a regex over full module names, as peft reads a string).
    _peft_target_modules = (
        r"(model\.vlm_with_expert\.lm_expert\..*\.(q|v)_proj|model\.(state_proj|action_in_proj"
        r"|action_out_proj|action_time_mlp_in|action_time_mlp_out))"
    )

    def __init__(self, config: SmolVLAConfig, *, pretrained_parts: bool = True) -> None:
        super().__init__(config, pretrained_parts=pretrained_parts)
        self.config: SmolVLAConfig
        self.model = VLAFlowMatching(config, build_weights=pretrained_parts)
        self.reset()

    def pretrained_weight_sources(self) -> list[tuple[str, str, Path | dict[str, Path]]]:
        """Built on the meta device with ``load_vlm_weights``: the VLM's weights, still to be
        read from its own files (downloaded into the Hub cache first where missing)."""
        source = self.model.vlm_with_expert.vlm_weights_from
        if source is None:
            return []
        return [("model.vlm_with_expert.vlm.", source, vlm_weight_files(source))]

    # --- inputs ----------------------------------------------------------------------------

    def prepare_images(self, batch: dict[str, Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        """Each present camera resized with padding and mapped to [-1, 1], with its mask; then
        up to ``empty_cameras`` missing cameras as all -1 frames, masked out."""
        cfg = self.config
        present = [k for k in cfg.image_features if k in batch]
        if not present:
            raise ValueError(
                f"the batch has none of the policy's cameras {sorted(cfg.image_features)}; "
                f"it has {sorted(batch)}"
            )
        images, masks = [], []
        for key in present:
            img = batch[key]
            if img.dim() == 5:
                img = img[:, -1]
            if cfg.resize_imgs_with_padding is not None:
                width, height = cfg.resize_imgs_with_padding
                img = resize_with_pad(img, height, width, pad_value=0.0)
            img = img * 2.0 - 1.0
            pad_key = f"{key}_padding_mask"
            if pad_key in batch:
                mask = batch[pad_key].bool()
            else:
                mask = torch.ones(img.shape[0], dtype=torch.bool, device=img.device)
            images.append(img)
            masks.append(mask)
        missing = len(cfg.image_features) - len(present)
        for _ in range(min(missing, cfg.empty_cameras)):
            images.append(torch.full_like(images[-1], -1.0))
            masks.append(torch.zeros_like(masks[-1]))
        return images, masks

    def prepare_state(self, batch: dict[str, Tensor]) -> Tensor:
        state = batch[OBS_STATE]
        if state.dim() > 2:
            state = state[:, -1]
        return pad_last_dim(state, self.config.max_state_dim)

    def _inputs(self, batch: dict[str, Tensor]) -> tuple:
        tokens, token_mask = self._language(batch)
        images, masks = self.prepare_images(batch)
        return images, masks, tokens, token_mask, self.prepare_state(batch)

    # --- training ---------------------------------------------------------------------------

    def _training_draws(
        self, batch: dict[str, Tensor], shape: tuple[int, ...], device: torch.device
    ) -> tuple[Tensor, Tensor]:
        keys = batch.get(SAMPLE_KEY)
        if keys is not None:
            noise = keyed_normal(keys, NOISE_STREAM, shape[1:])
            # Beta(alpha, 1) by inversion: u ** (1 / alpha).
            u = keyed_uniform(keys, TIME_STREAM, 1)[:, 0]
            t = u ** (1.0 / TIME_ALPHA)
        else:
            noise = torch.randn(shape, device=device)
            t = (
                torch.distributions.Beta(torch.tensor(TIME_ALPHA), torch.tensor(1.0))
                .sample((shape[0],))
                .to(device)
            )
        return noise, (t * TIME_SCALE + TIME_OFFSET).float()

    def loss_normalizers(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """The loss averages over the non-padded (step, action value) entries: their count."""
        if ACTION_IS_PAD not in batch:
            return {}
        valid = (~batch[ACTION_IS_PAD].bool()).sum()
        return {"mse": valid * self.config.action_feature["shape"][0]}

    def forward(
        self,
        batch: dict[str, Tensor],
        noise: Tensor | None = None,
        time: Tensor | None = None,
        reduction: str = "mean",
        normalizers: dict[str, tuple[Tensor, int]] | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The flow-matching loss: a scalar (``reduction`` mean) or one per sample (none).
        ``noise`` (B, chunk_size, max_action_dim) and ``time`` (B,) fix the draws."""
        if reduction not in ("mean", "none"):
            raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
        actions = pad_last_dim(batch[ACTION], self.config.max_action_dim)
        noise, time = self._draws(batch, actions, noise, time)
        losses = self.model.velocity_loss(*self._inputs(batch), actions, noise, time)
        losses = losses[:, :, : self.config.action_feature["shape"][0]]
        is_pad = batch.get(ACTION_IS_PAD)
        if is_pad is not None:
            valid = ~is_pad.bool()
            losses = losses * valid.unsqueeze(-1)
        if reduction == "none":
            if is_pad is None:
                per_sample = losses.mean(dim=(1, 2))
            else:
                count = (valid.sum(dim=1) * losses.shape[-1]).clamp_min(1)
                per_sample = losses.sum(dim=(1, 2)) / count
            return per_sample, {"loss": per_sample.detach().mean()}
        if is_pad is None:
            loss = losses.mean()
        else:
            given = (normalizers or {}).get("mse")
            if given is not None:
                total, shares = given
                denominator = total.float().clamp_min(1) / shares
            else:
                denominator = (valid.sum() * losses.shape[-1]).clamp_min(1)
            loss = losses.sum() / denominator
        return loss, {}
