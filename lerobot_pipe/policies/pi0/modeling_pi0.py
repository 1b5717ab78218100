"""pi0 and pi0.5: a PaliGemma prefix (frames, prompt tokens) and a Gemma action expert that turns
noise into an action chunk by flow matching; LeRobot 0.6.1's weights, masks, loss and sampler.

Training (``forward``): for actions ``a`` (zero-padded to ``max_action_dim``), noise ``n`` and a
time ``t`` (``Beta(alpha, beta) * scale + offset``), the expert sees ``x_t = t n + (1 - t) a`` and
regresses the velocity ``n - a``: the squared error over the real action dimensions, averaged
over every step (as LeRobot's, padded steps at an episode's end are not masked out). Sampling
integrates the predicted velocity from ``t = 1`` to 0 in ``num_inference_steps`` Euler steps
over a key/value cache of the prefix.

pi0's suffix is a state token (``state_proj``) then the action tokens, each fused with the
flow time (``action_time_mlp_*``); pi0.5 has no state token (the state is in the prompt, see
processor_pi0.py) and conditions the expert's AdaRMS norms on the time (``time_mlp_*``).

Training randomness (noise and time) is drawn per sample from ``batch["sample_key"]``
(:mod:`lerobot_pipe.utils.random`) when the batch has one and none is passed, so a
data-parallel run computes what one process computes; otherwise from torch's RNG, as LeRobot's.
"""

from __future__ import annotations

import numpy as np
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
from lerobot_pipe.policies.pi0.configuration_pi0 import PI0Config, PiConfigBase
from lerobot_pipe.policies.pi0.paligemma_expert import PaliGemmaWithExpertModel
from lerobot_pipe.policies.pretrained import ACTION, OBS_STATE
from lerobot_pipe.utils.random import keyed_normal, keyed_uniform, stream_id

NOISE_STREAM = stream_id("pi.noise")
TIME_STREAM = stream_id("pi.time")
EMBED_KEY = "model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
LM_HEAD_KEY = "model.paligemma_with_expert.paligemma.lm_head.weight"


def resize_with_pad(img: Tensor, height: int, width: int) -> Tensor:
    """(B, C, h, w) in [0, 1] -> (B, C, height, width): bilinear resize keeping the aspect ratio,
    clamped to [0, 1], then zero padding centred (openpi's convention)."""
    h, w = img.shape[-2:]
    ratio = max(w / width, h / height)
    new_h, new_w = int(h / ratio), int(w / ratio)
    img = F.interpolate(img, size=(new_h, new_w), mode="bilinear", align_corners=False)
    img = img.clamp(0.0, 1.0)
    top, extra_h = divmod(height - new_h, 2)
    left, extra_w = divmod(width - new_w, 2)
    return F.pad(img, (left, left + extra_w, top, top + extra_h), value=0.0)


class PiFlowMatching(nn.Module):
    """The backbone (``paligemma_with_expert``) and the heads around it (LeRobot's PI0Pytorch /
    PI05Pytorch)."""

    def __init__(self, config: PiConfigBase, *, pi05: bool) -> None:
        super().__init__()
        self.config = config
        self.pi05 = pi05
        text, expert = config.gemma_geometry
        self.paligemma_with_expert = PaliGemmaWithExpertModel(
            text,
            expert,
            config.siglip_geometry,
            config.image_resolution[0],
            adarms=pi05,
            freeze_vision_encoder=config.freeze_vision_encoder,
            train_expert_only=config.train_expert_only,
        )
        if config.dtype == "bfloat16":
            self.paligemma_with_expert.to_bfloat16_for_selected_params()
        width = expert.width
        self.action_in_proj = nn.Linear(config.max_action_dim, width)
        self.action_out_proj = nn.Linear(width, config.max_action_dim)
        if pi05:
            self.time_mlp_in = nn.Linear(width, width)
            self.time_mlp_out = nn.Linear(width, width)
        else:
            self.state_proj = nn.Linear(config.max_state_dim, width)
            self.action_time_mlp_in = nn.Linear(2 * width, width)
            self.action_time_mlp_out = nn.Linear(width, width)

    # --- token streams ----------------------------------------------------------------------

    def embed_prefix(
        self, images: list[Tensor], image_masks: list[Tensor], tokens: Tensor, token_mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(embeddings, pad mask, block starts) of the frames and the prompt: one block."""
        backbone = self.paligemma_with_expert
        parts, pads = [], []
        for image, mask in zip(images, image_masks, strict=True):
            embedded = backbone.embed_image(image)
            parts.append(embedded)
            pads.append(mask[:, None].expand(-1, embedded.shape[1]))
        language = backbone.embed_tokens(tokens)
        parts.append(language.to(parts[0].dtype) if parts else language)
        pads.append(token_mask.bool())
        pad = torch.cat(pads, dim=1)
        return torch.cat(parts, dim=1), pad, torch.zeros_like(pad, dtype=torch.long)

    @staticmethod
    def _head(layer: nn.Linear, x: Tensor) -> Tensor:
        # Each head reads its input in its own dtype (bf16 under FSDP2's mixed precision).
        return layer(x.to(layer.weight.dtype))

    def embed_suffix(
        self, state: Tensor | None, noisy: Tensor, t: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """(embeddings, pad mask, block starts, AdaRMS condition) of the suffix: pi0's state
        token starts a block and the action tokens the next (each sees the ones before it in
        its block: bidirectional); pi0.5's action tokens form one block."""
        cfg = self.config
        actions = self._head(self.action_in_proj, noisy)
        # In the flow time's dtype (openpi's create_sinusoidal_pos_embedding).
        times = time_embedding(t, actions.shape[-1], cfg.min_period, cfg.max_period).to(t.dtype)
        b, n = actions.shape[:2]
        blocks = torch.zeros(b, cfg.chunk_size, dtype=torch.long, device=actions.device)
        blocks[:, 0] = 1
        if self.pi05:
            cond = F.silu(self._head(self.time_mlp_in, times))
            cond = F.silu(self._head(self.time_mlp_out, cond))
            pad = torch.ones(b, n, dtype=torch.bool, device=actions.device)
            return actions, pad, blocks, cond
        state_token = self._head(self.state_proj, state)[:, None]
        fused = torch.cat([actions, times[:, None].expand_as(actions).to(actions.dtype)], dim=2)
        fused = self._head(
            self.action_time_mlp_out, F.silu(self._head(self.action_time_mlp_in, fused))
        )
        embeddings = torch.cat([state_token.to(fused.dtype), fused], dim=1)
        pad = torch.ones(b, n + 1, dtype=torch.bool, device=actions.device)
        first = torch.ones(b, 1, dtype=torch.long, device=actions.device)
        return embeddings, pad, torch.cat([first, blocks], dim=1), None

    def _velocity(self, out: Tensor) -> Tensor:
        """The expert's last ``chunk_size`` outputs in float32 through ``action_out_proj``."""
        return self._head(self.action_out_proj, out[:, -self.config.chunk_size :].float()).float()

    # --- loss and sampler ---------------------------------------------------------------------

    def velocity_loss(
        self,
        images: list[Tensor],
        image_masks: list[Tensor],
        tokens: Tensor,
        token_mask: Tensor,
        state: Tensor | None,
        actions: Tensor,
        noise: Tensor,
        t: Tensor,
    ) -> Tensor:
        """Per-element squared error (B, chunk, max_action_dim) of the predicted velocity."""
        tt = t[:, None, None]
        x_t = tt * noise + (1 - tt) * actions
        prefix, prefix_pad, prefix_blocks = self.embed_prefix(
            images, image_masks, tokens, token_mask
        )
        suffix, suffix_pad, suffix_blocks, cond = self.embed_suffix(state, x_t, t)
        pad = torch.cat([prefix_pad, suffix_pad], dim=1)
        mask = attention_2d(pad, torch.cat([prefix_blocks, suffix_blocks], dim=1))
        positions = torch.cumsum(pad, dim=1) - 1
        out = self.paligemma_with_expert.forward_joint(prefix, suffix, mask, positions, cond)
        return F.mse_loss(noise - actions, self._velocity(out), reduction="none")

    def sample_actions(
        self,
        images: list[Tensor],
        image_masks: list[Tensor],
        tokens: Tensor,
        token_mask: Tensor,
        state: Tensor | None,
        noise: Tensor | None = None,
    ) -> Tensor:
        """(B, chunk_size, max_action_dim) actions by Euler integration from ``noise``."""
        cfg = self.config
        b, device = tokens.shape[0], tokens.device
        if noise is None:
            noise = torch.randn(b, cfg.chunk_size, cfg.max_action_dim, device=device)
        prefix, prefix_pad, prefix_blocks = self.embed_prefix(
            images, image_masks, tokens, token_mask
        )
        backbone = self.paligemma_with_expert
        cache = backbone.encode_prefix(
            prefix, attention_2d(prefix_pad, prefix_blocks), torch.cumsum(prefix_pad, dim=1) - 1
        )
        offsets = prefix_pad.sum(dim=-1)[:, None]
        dt = -1.0 / cfg.num_inference_steps
        x_t = noise
        for step in range(cfg.num_inference_steps):
            t = torch.tensor(1.0 + step * dt, dtype=torch.float32, device=device).expand(b)
            suffix, suffix_pad, suffix_blocks, cond = self.embed_suffix(state, x_t, t)
            s = suffix_pad.shape[1]
            mask = torch.cat(
                [prefix_pad[:, None, :].expand(b, s, -1), attention_2d(suffix_pad, suffix_blocks)],
                dim=2,
            )
            positions = offsets + torch.cumsum(suffix_pad, dim=1) - 1
            out = backbone.forward_suffix(cache, suffix, mask, positions, cond)
            x_t = x_t + dt * self._velocity(out)
        return x_t


class PiPolicyBase(FlowMatchingPolicy):
    """pi0 / pi0.5: training loss, chunk prediction and step-wise action selection.

    Batches are already normalized and tokenized: each camera ``observation.images.<name>``
    (B, 3, H, W) in [0, 1], ``observation.state`` (B, state_dim), ``observation.language.tokens``
    / ``.attention_mask`` (B, L); for training ``action`` (B, chunk_size, action_dim) and the
    loader's ``sample_key`` (B,).
    """

    config_class = PI0Config
    # The vision tower's layers, both stacks' decoder layers (their work runs through their
    # unit entries, paligemma_expert.py), each decoder layer's MLP as a unit inside its layer's
    # (Gemma 2B's is 403 of its layer's 440 MB in fp32: gathered only while it runs, so that
    # FSDP2's in-flight buffers -- the unit computing, the next one prefetched, the last one's
    # reduce-scatter input -- stay a fraction of a layer) and the two lm_heads; the token
    # embedding is vocab-parallel (PiTokenEmbedding.fsdp_vocab_parallel): nothing large stays in
    # the root unit.
    _fsdp_wrap_modules = [
        "SiglipEncoderLayer",
        "PiGemmaDecoderLayer",
        "GemmaMLP",
        "PiLMHead",
    ]
    _pi05 = False

    def __init__(self, config: PiConfigBase, *, pretrained_parts: bool = True) -> None:
        super().__init__(config, pretrained_parts=pretrained_parts)
        self.config: PiConfigBase
        self.model = PiFlowMatching(config, pi05=self._pi05)
        if config.gradient_checkpointing:
            from lerobot_pipe.distributed.activation_checkpointing import (
                apply_activation_checkpointing,
            )

            units = ("SiglipEncoderLayer", "PiGemmaDecoderLayer")
            names = [n for n, m in self.named_modules() if type(m).__name__ in units]
            apply_activation_checkpointing(self, names)
        if config.compile_model:
            self.model.velocity_loss = torch.compile(
                self.model.velocity_loss, mode=config.compile_mode
            )
            self.model.sample_actions = torch.compile(
                self.model.sample_actions, mode=config.compile_mode
            )
        self.reset()

    def map_file_keys(self, file_keys: set[str]) -> tuple[dict[str, str], set[str]]:
        """LeRobot's key fixes for ``lerobot/pi0_base`` / ``pi05_base``-layout files: the
        ``model.`` prefix added; openpi's names renamed (``time_mlp_*`` <-> ``action_time_mlp_*``);
        the embedding read from ``lm_head`` when the file has none; pi0.5 ignores
        ``state_proj`` and the expert's plain RMSNorm weights (its norms are AdaRMS)."""
        ours, theirs = (
            ("time_mlp_", "action_time_mlp_")
            if self._pi05
            else (
                "action_time_mlp_",
                "time_mlp_",
            )
        )
        mapping, ignored = {}, set()
        for key in file_keys:
            name = key
            if not key.startswith("model."):
                if key.startswith(theirs):
                    name = ours + key.removeprefix(theirs)
                name = "model." + name
            if self._pi05 and (
                name.startswith("model.state_proj.")
                or (
                    ".gemma_expert.model." in name
                    and name.endswith(("layernorm.weight", "model.norm.weight"))
                )
            ):
                ignored.add(key)
                continue
            mapping[name] = key
        if EMBED_KEY not in mapping and LM_HEAD_KEY in mapping:
            mapping[EMBED_KEY] = mapping[LM_HEAD_KEY]
        return mapping, ignored

    # --- inputs ----------------------------------------------------------------------------

    def prepare_images(self, batch: dict[str, Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        """Each present camera resized with centred padding and mapped to [-1, 1], with its
        mask; then each missing camera as an all -1 frame, masked out (LeRobot's)."""
        cfg = self.config
        present = [k for k in cfg.image_features if k in batch]
        if not present:
            raise ValueError(
                f"the batch has none of the policy's cameras {sorted(cfg.image_features)}; "
                f"it has {sorted(batch)}"
            )
        size = tuple(cfg.image_resolution)
        images, masks = [], []
        for key in present:
            img = batch[key]
            if img.dim() == 5:
                img = img[:, -1]
            img = img.float()
            if tuple(img.shape[-2:]) != size:
                img = resize_with_pad(img, *size)
            images.append(img * 2.0 - 1.0)
            masks.append(torch.ones(img.shape[0], dtype=torch.bool, device=img.device))
        for _ in range(len(cfg.image_features) - len(present)):
            images.append(torch.full_like(images[-1], -1.0))
            masks.append(torch.zeros_like(masks[-1]))
        return images, masks

    def prepare_state(self, batch: dict[str, Tensor]) -> Tensor | None:
        if self._pi05:
            return None
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
        cfg = self.config
        keys = batch.get(SAMPLE_KEY)
        if keys is not None:
            noise = keyed_normal(keys, NOISE_STREAM, shape[1:]).to(device)
            alpha, beta = cfg.time_sampling_beta_alpha, cfg.time_sampling_beta_beta
            if beta == 1.0:  # Beta(alpha, 1) by inversion: u ** (1 / alpha)
                t = keyed_uniform(keys, TIME_STREAM, 1)[:, 0].to(device) ** (1.0 / alpha)
            else:  # any Beta: one generator per sample key
                draws = [
                    np.random.default_rng((int(k), TIME_STREAM)).beta(alpha, beta)
                    for k in keys.tolist()
                ]
                t = torch.tensor(draws, dtype=torch.float32, device=device)
        else:
            noise = torch.randn(shape, device=device)
            beta = torch.distributions.Beta(
                torch.tensor(cfg.time_sampling_beta_alpha),
                torch.tensor(cfg.time_sampling_beta_beta),
            )
            t = beta.sample((shape[0],)).to(device)
        return noise, (t * cfg.time_sampling_scale + cfg.time_sampling_offset).float()

    def forward(
        self,
        batch: dict[str, Tensor],
        noise: Tensor | None = None,
        time: Tensor | None = None,
        reduction: str = "mean",
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The flow-matching loss: a scalar (``reduction`` mean) or one per sample (none).
        ``noise`` (B, chunk_size, max_action_dim) and ``time`` (B,) fix the draws."""
        if reduction not in ("mean", "none"):
            raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
        actions = pad_last_dim(batch[ACTION], self.config.max_action_dim).float()
        noise, time = self._draws(batch, actions, noise, time)
        losses = self.model.velocity_loss(*self._inputs(batch), actions, noise, time)
        losses = losses[:, :, : self.config.action_feature["shape"][0]]
        if reduction == "none":
            per_sample = losses.mean(dim=(1, 2))
            return per_sample, {"loss": per_sample.detach().mean()}
        return losses.mean(), {}


class PI0Policy(PiPolicyBase):
    """pi0 (policy type "pi0")."""

    config_class = PI0Config
    name = "pi0"
    # LeRobot's default pi0 LoRA targets: the expert's q/v projections and the heads (a regex
    # over full module names, as peft reads a string).
    _peft_target_modules = (
        r"(.*\.gemma_expert\..*\.self_attn\.(q|v)_proj|model\.(state_proj|action_in_proj"
        r"|action_out_proj|action_time_mlp_in|action_time_mlp_out))"
    )
