"""ACT: Action Chunking Transformer (Zhao et al., "Learning Fine-Grained Bimanual Manipulation
with Low-Cost Hardware", 2023), with LeRobot's module and parameter names.

A conditional VAE: during training, a transformer encoder reads [cls, robot state, action
chunk] and yields the latent's mean and log-variance; the sampled latent, the robot state,
the environment state and one token per pixel of each camera's layer4 feature map (a ResNet
with frozen batch norm, projected to ``dim_model`` by a 1x1 convolution, with 2-D sinusoidal
position embeddings) are tokens of the main transformer encoder, whose output the decoder's
``chunk_size`` learned queries cross-attend to predict the action chunk. At inference (or
with ``use_vae=False``) the latent is zero.

Cameras whose frames have the same shape go through the backbone as one batch (one call, one
FSDP2 all-gather per backbone block); the tokens are the same as camera by camera.

Tensors inside the transformer are sequence-first: (sequence, batch, dim_model). All
randomness (dropout, latent sampling) draws from torch's global RNG.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from lerobot_pipe.policies.act.configuration_act import ACTConfig
from lerobot_pipe.policies.pretrained import (
    ACTION,
    OBS_ENV_STATE,
    OBS_STATE,
    PreTrainedPolicy,
)
from lerobot_pipe.policies.vision import (
    BasicBlock,
    Bottleneck,
    load_imagenet_weights,
    resnet_backbone,
)

ACTION_IS_PAD = "action_is_pad"
# Parameter names of the vision backbone, trained at optimizer_lr_backbone.
BACKBONE_PREFIX = "model.backbone"


def create_sinusoidal_pos_embedding(num_positions: int, dimension: int) -> Tensor:
    """1-D sinusoidal position embeddings of "Attention Is All You Need": (num_positions, dimension)."""
    position = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)
    exponent = 2 * (torch.arange(dimension, dtype=torch.float64) // 2) / dimension
    angles = position / torch.pow(10000.0, exponent)
    table = torch.empty_like(angles)
    table[:, 0::2] = torch.sin(angles[:, 0::2])
    table[:, 1::2] = torch.cos(angles[:, 1::2])
    return table.float()


class ACTSinusoidalPositionEmbedding2d(nn.Module):
    """2-D sinusoidal position embeddings of an image feature map (DETR style).

    Half of ``2 * dimension`` channels encode the row, half the column; positions are
    normalized to (0, 2*pi]. Maps a (B, C, H, W) feature map to a (1, 2*dimension, H, W)
    embedding.
    """

    def __init__(self, dimension: int) -> None:
        super().__init__()
        self.dimension = dimension
        self._two_pi = 2 * math.pi
        self._eps = 1e-6
        self._temperature = 10000

    def forward(self, x: Tensor) -> Tensor:
        ones = torch.ones_like(x[0, :1], dtype=torch.float32)  # (1, H, W)
        y_range = ones.cumsum(1)
        x_range = ones.cumsum(2)
        y_range = y_range / (y_range[:, -1:, :] + self._eps) * self._two_pi
        x_range = x_range / (x_range[:, :, -1:] + self._eps) * self._two_pi
        steps = torch.arange(self.dimension, dtype=torch.float32, device=x.device)
        inverse_frequency = self._temperature ** (2 * (steps // 2) / self.dimension)
        x_range = x_range.unsqueeze(-1) / inverse_frequency  # (1, H, W, dimension)
        y_range = y_range.unsqueeze(-1) / inverse_frequency
        pos_x = torch.stack((x_range[..., 0::2].sin(), x_range[..., 1::2].cos()), dim=-1).flatten(3)
        pos_y = torch.stack((y_range[..., 0::2].sin(), y_range[..., 1::2].cos()), dim=-1).flatten(3)
        return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)


def _activation(name: str) -> Callable[[Tensor], Tensor]:
    if name == "relu":
        return F.relu
    if name == "gelu":
        return F.gelu
    raise ValueError(f"unknown feedforward_activation {name!r}")


def _with_pos(x: Tensor, pos_embed: Tensor | None) -> Tensor:
    return x if pos_embed is None else x + pos_embed


def _residual(
    x: Tensor,
    block: Callable[[Tensor], Tensor],
    norm: nn.Module,
    dropout: nn.Module,
    pre_norm: bool,
) -> Tensor:
    """One sub-layer of a transformer layer with its skip connection: ``x + dropout(block(norm(x)))``
    (pre-norm) or ``norm(x + dropout(block(x)))`` (post-norm)."""
    if pre_norm:
        return x + dropout(block(norm(x)))
    return norm(x + dropout(block(x)))


def _feed_forward(layer: ACTEncoderLayer | ACTDecoderLayer, x: Tensor) -> Tensor:
    return layer.linear2(layer.dropout(layer.activation(layer.linear1(x))))


def _leading_rows_dropout(dropout: nn.Module, x: Tensor, rows: int) -> Tensor:
    """``dropout`` of a (rows + more, ...) tensor whose leading ``x`` (``rows`` of them) is all
    that is used: the mask of the whole is drawn (the generator advances as for the whole, and
    ``x``'s part of it is what dropout over the whole would draw), applied to ``x`` alone."""
    p = dropout.p
    if not dropout.training or p == 0.0:
        return x
    noise = x.new_empty((rows, *x.shape[1:])).bernoulli_(1.0 - p)
    return x * noise.div_(1.0 - p)[: x.shape[0]]


def _first_row_feed_forward(layer: ACTEncoderLayer, x: Tensor) -> Tensor:
    """Row 0 of the feed-forward sub-layer over ``x`` (L, B, D), for a layer of which only that
    row is used: the same values as the whole sub-layer's row 0, and every dropout mask drawn
    for all L rows (the same draws as the whole, for the rest of the step)."""
    rows, y = x.shape[0], x[:1]
    h = layer.norm2(y) if layer.pre_norm else y
    h = _leading_rows_dropout(layer.dropout, layer.activation(layer.linear1(h)), rows)
    out = y + _leading_rows_dropout(layer.dropout2, layer.linear2(h), rows)
    return out if layer.pre_norm else layer.norm2(out)


class ACTEncoderLayer(nn.Module):
    """Self-attention and feed-forward block, post-norm unless ``config.pre_norm``."""

    def __init__(self, config: ACTConfig) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(config.dim_model, config.n_heads, config.dropout)
        self.linear1 = nn.Linear(config.dim_model, config.dim_feedforward)
        self.dropout = nn.Dropout(config.dropout)
        self.linear2 = nn.Linear(config.dim_feedforward, config.dim_model)
        self.norm1 = nn.LayerNorm(config.dim_model)
        self.norm2 = nn.LayerNorm(config.dim_model)
        self.dropout1 = nn.Dropout(config.dropout)
        self.dropout2 = nn.Dropout(config.dropout)
        self.activation = _activation(config.feedforward_activation)
        self.pre_norm = config.pre_norm

    def forward(
        self,
        x: Tensor,
        pos_embed: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        first_row_only: bool = False,
    ) -> Tensor:
        """(L, B, D) -> (L, B, D); with ``first_row_only`` (the last layer of an encoder whose
        row 0 alone is used), (1, B, D): that row, without the feed-forward work of the others
        (its masks still drawn whole: the same random numbers as the full layer's)."""

        def attend(y: Tensor) -> Tensor:
            q = k = _with_pos(y, pos_embed)
            return self.self_attn(
                q, k, value=y, key_padding_mask=key_padding_mask, need_weights=False
            )[0]

        x = _residual(x, attend, self.norm1, self.dropout1, self.pre_norm)
        if first_row_only and 0.0 <= self.dropout.p < 1.0 and 0.0 <= self.dropout2.p < 1.0:
            return _first_row_feed_forward(self, x)
        x = _residual(x, lambda y: _feed_forward(self, y), self.norm2, self.dropout2, self.pre_norm)
        return x[:1] if first_row_only else x


class ACTEncoder(nn.Module):
    """A stack of ACTEncoderLayer: the main encoder or, with ``is_vae_encoder``, the VAE's."""

    def __init__(self, config: ACTConfig, is_vae_encoder: bool = False) -> None:
        super().__init__()
        num_layers = config.n_vae_encoder_layers if is_vae_encoder else config.n_encoder_layers
        self.layers = nn.ModuleList([ACTEncoderLayer(config) for _ in range(num_layers)])
        self.norm = nn.LayerNorm(config.dim_model) if config.pre_norm else nn.Identity()

    def forward(
        self,
        x: Tensor,
        pos_embed: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        first_row_only: bool = False,
    ) -> Tensor:
        """(L, B, D) -> (L, B, D), or only row 0, (1, B, D), with ``first_row_only`` (the VAE
        encoder: its cls token's output is all it gives; the last layer then computes the
        feed-forward of that row alone, ~1/L of its largest matmuls)."""
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            only = first_row_only and i == last
            x = layer(
                x, pos_embed=pos_embed, key_padding_mask=key_padding_mask, first_row_only=only
            )
        if first_row_only and not self.layers:
            x = x[:1]
        return self.norm(x)


class ACTDecoderLayer(nn.Module):
    """Self-attention over the queries, cross-attention to the encoder output, feed-forward."""

    def __init__(self, config: ACTConfig) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(config.dim_model, config.n_heads, config.dropout)
        self.multihead_attn = nn.MultiheadAttention(
            config.dim_model, config.n_heads, config.dropout
        )
        self.linear1 = nn.Linear(config.dim_model, config.dim_feedforward)
        self.dropout = nn.Dropout(config.dropout)
        self.linear2 = nn.Linear(config.dim_feedforward, config.dim_model)
        self.norm1 = nn.LayerNorm(config.dim_model)
        self.norm2 = nn.LayerNorm(config.dim_model)
        self.norm3 = nn.LayerNorm(config.dim_model)
        self.dropout1 = nn.Dropout(config.dropout)
        self.dropout2 = nn.Dropout(config.dropout)
        self.dropout3 = nn.Dropout(config.dropout)
        self.activation = _activation(config.feedforward_activation)
        self.pre_norm = config.pre_norm

    def forward(
        self,
        x: Tensor,
        encoder_out: Tensor,
        decoder_pos_embed: Tensor | None = None,
        encoder_pos_embed: Tensor | None = None,
    ) -> Tensor:
        def attend(y: Tensor) -> Tensor:
            q = k = _with_pos(y, decoder_pos_embed)
            return self.self_attn(q, k, value=y, need_weights=False)[0]

        def attend_encoder(y: Tensor) -> Tensor:
            return self.multihead_attn(
                query=_with_pos(y, decoder_pos_embed),
                key=_with_pos(encoder_out, encoder_pos_embed),
                value=encoder_out,
                need_weights=False,
            )[0]

        x = _residual(x, attend, self.norm1, self.dropout1, self.pre_norm)
        x = _residual(x, attend_encoder, self.norm2, self.dropout2, self.pre_norm)
        return _residual(
            x, lambda y: _feed_forward(self, y), self.norm3, self.dropout3, self.pre_norm
        )


class ACTDecoder(nn.Module):
    """A stack of ACTDecoderLayer followed by a LayerNorm."""

    def __init__(self, config: ACTConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [ACTDecoderLayer(config) for _ in range(config.n_decoder_layers)]
        )
        self.norm = nn.LayerNorm(config.dim_model)

    def forward(
        self,
        x: Tensor,
        encoder_out: Tensor,
        decoder_pos_embed: Tensor | None = None,
        encoder_pos_embed: Tensor | None = None,
    ) -> Tensor:
        for layer in self.layers:
            x = layer(
                x,
                encoder_out,
                decoder_pos_embed=decoder_pos_embed,
                encoder_pos_embed=encoder_pos_embed,
            )
        return self.norm(x)


def _require(batch: dict[str, Tensor], key: str) -> Tensor:
    if key not in batch:
        raise KeyError(f"ACT batch lacks {key!r}; it has {sorted(batch)}")
    return batch[key]


class ACT(nn.Module):
    """The ACT network: VAE encoder (optional), camera backbone (with cameras), transformer
    encoder and decoder, action head.

    ``pretrained_backbone`` loads ``config.pretrained_backbone_weights`` into the backbone
    (False: leave it randomly initialized, for weights loaded right after, or a meta device)."""

    def __init__(self, config: ACTConfig, pretrained_backbone: bool = True) -> None:
        super().__init__()
        self.config = config
        state_ft = config.robot_state_feature
        env_ft = config.env_state_feature
        self.camera_keys = list(config.image_features)
        action_dim = config.action_feature["shape"][0]
        d = config.dim_model

        self.vae_encoder: ACTEncoder | None = None
        self.vae_encoder_robot_state_input_proj: nn.Linear | None = None
        if config.use_vae:
            self.vae_encoder = ACTEncoder(config, is_vae_encoder=True)
            self.vae_encoder_cls_embed = nn.Embedding(1, d)
            if state_ft is not None:
                self.vae_encoder_robot_state_input_proj = nn.Linear(state_ft["shape"][0], d)
            self.vae_encoder_action_input_proj = nn.Linear(action_dim, d)
            self.vae_encoder_latent_output_proj = nn.Linear(d, config.latent_dim * 2)
            num_vae_tokens = 1 + (state_ft is not None) + config.chunk_size
            self.register_buffer(
                "vae_encoder_pos_enc",
                create_sinusoidal_pos_embedding(num_vae_tokens, d).unsqueeze(0),
            )

        # Modules are registered in LeRobot's order: parameter order is what the integer keys
        # of optimizer_state.safetensors refer to.
        self.backbone = None
        if self.camera_keys:
            self.backbone = resnet_backbone(
                config.vision_backbone, config.replace_final_stride_with_dilation
            )
            if pretrained_backbone and config.pretrained_backbone_weights:
                load_imagenet_weights(
                    self.backbone, config.vision_backbone, config.pretrained_backbone_weights
                )
        self.encoder = ACTEncoder(config)
        self.decoder = ACTDecoder(config)
        self.encoder_robot_state_input_proj: nn.Linear | None = None
        if state_ft is not None:
            self.encoder_robot_state_input_proj = nn.Linear(state_ft["shape"][0], d)
        self.encoder_env_state_input_proj: nn.Linear | None = None
        if env_ft is not None:
            self.encoder_env_state_input_proj = nn.Linear(env_ft["shape"][0], d)
        self.encoder_latent_input_proj = nn.Linear(config.latent_dim, d)
        if self.backbone is not None:
            self.encoder_img_feat_input_proj = nn.Conv2d(
                self.backbone.out_channels, d, kernel_size=1
            )
        n_1d_tokens = 1 + (state_ft is not None) + (env_ft is not None)
        self.encoder_1d_feature_pos_embed = nn.Embedding(n_1d_tokens, d)
        if self.backbone is not None:
            self.encoder_cam_feat_pos_embed = ACTSinusoidalPositionEmbedding2d(d // 2)
        self.decoder_pos_embed = nn.Embedding(config.chunk_size, d)
        self.action_head = nn.Linear(d, action_dim)

        for p in [*self.encoder.parameters(), *self.decoder.parameters()]:
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def forward(
        self, batch: dict[str, Tensor]
    ) -> tuple[Tensor, tuple[Tensor, Tensor] | tuple[None, None]]:
        """Predict an action chunk (B, chunk_size, action_dim).

        Also returns the latent's (mu, log(sigma^2)), each (B, latent_dim), when the VAE
        encoder ran (``use_vae`` and training mode), else ``(None, None)``.
        """
        config = self.config
        reference = _require(batch, self.camera_keys[0] if self.camera_keys else OBS_ENV_STATE)
        batch_size = reference.shape[0]

        if self.vae_encoder is not None and self.training:
            latent_sample, mu, log_sigma_x2 = self._encode_latent(batch, batch_size)
        else:
            mu = log_sigma_x2 = None
            latent_sample = reference.new_zeros(batch_size, config.latent_dim)

        tokens = [self.encoder_latent_input_proj(latent_sample)]
        if self.encoder_robot_state_input_proj is not None:
            tokens.append(self.encoder_robot_state_input_proj(_require(batch, OBS_STATE)))
        if self.encoder_env_state_input_proj is not None:
            tokens.append(self.encoder_env_state_input_proj(batch[OBS_ENV_STATE]))
        encoder_in = torch.stack(tokens, dim=0)  # (n_1d_tokens, B, D)
        encoder_pos_embed = self.encoder_1d_feature_pos_embed.weight.unsqueeze(1)  # (n, 1, D)
        if self.backbone is not None:
            camera_tokens, camera_pos = self._camera_tokens(batch)
            encoder_in = torch.cat([encoder_in, *camera_tokens], dim=0)
            encoder_pos_embed = torch.cat([encoder_pos_embed, *camera_pos], dim=0)
        encoder_out = self.encoder(encoder_in, pos_embed=encoder_pos_embed)

        decoder_in = encoder_out.new_zeros(config.chunk_size, batch_size, config.dim_model)
        decoder_out = self.decoder(
            decoder_in,
            encoder_out,
            decoder_pos_embed=self.decoder_pos_embed.weight.unsqueeze(1),
            encoder_pos_embed=encoder_pos_embed,
        )
        actions = self.action_head(decoder_out.transpose(0, 1))
        if mu is None:
            return actions, (None, None)
        return actions, (mu, log_sigma_x2)

    def _camera_tokens(self, batch: dict[str, Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        """Per camera (in ``image_features`` order): its feature-map tokens (h*w, B, D) and their
        position embeddings (h*w, 1, D), pixels in row-major order."""
        by_shape: dict[tuple[int, ...], list[str]] = {}
        for key in self.camera_keys:
            by_shape.setdefault(tuple(_require(batch, key).shape), []).append(key)
        tokens: dict[str, Tensor] = {}
        positions: dict[str, Tensor] = {}
        for keys in by_shape.values():
            frames = batch[keys[0]] if len(keys) == 1 else torch.cat([batch[k] for k in keys])
            feature_map = self.backbone(frames)  # (n_cameras * B, C, h, w)
            pos = self.encoder_cam_feat_pos_embed(feature_map).to(feature_map.dtype)
            pos = pos.flatten(2).permute(2, 0, 1)  # (h*w, 1, D)
            projected = self.encoder_img_feat_input_proj(feature_map)
            for key, part in zip(keys, projected.chunk(len(keys)), strict=True):
                tokens[key] = part.flatten(2).permute(2, 0, 1)  # (h*w, B, D)
                positions[key] = pos
        return [tokens[k] for k in self.camera_keys], [positions[k] for k in self.camera_keys]

    def _encode_latent(
        self, batch: dict[str, Tensor], batch_size: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Run the VAE encoder on [cls, robot state, actions]; return (sample, mu, log sigma^2)."""
        actions = _require(batch, ACTION)
        action_is_pad = _require(batch, ACTION_IS_PAD)
        tokens = [self.vae_encoder_cls_embed.weight.unsqueeze(0).expand(batch_size, -1, -1)]
        if self.vae_encoder_robot_state_input_proj is not None:
            state = _require(batch, OBS_STATE)
            tokens.append(self.vae_encoder_robot_state_input_proj(state).unsqueeze(1))
        tokens.append(self.vae_encoder_action_input_proj(actions))
        vae_in = torch.cat(tokens, dim=1)  # (B, 1 [+1] + chunk_size, D)
        n_prefix = vae_in.shape[1] - actions.shape[1]
        prefix_is_pad = action_is_pad.new_zeros(batch_size, n_prefix)
        key_padding_mask = torch.cat([prefix_is_pad, action_is_pad.bool()], dim=1)
        cls_out = self.vae_encoder(
            vae_in.transpose(0, 1),
            pos_embed=self.vae_encoder_pos_enc.transpose(0, 1).to(vae_in.dtype),
            key_padding_mask=key_padding_mask,
            first_row_only=True,
        )[0]
        latent_params = self.vae_encoder_latent_output_proj(cls_out)
        mu = latent_params[:, : self.config.latent_dim]
        log_sigma_x2 = latent_params[:, self.config.latent_dim :]
        sample = mu + log_sigma_x2.div(2).exp() * torch.randn_like(mu)
        return sample, mu, log_sigma_x2


class ACTTemporalEnsembler:
    """Exponentially weighted average of the actions that overlapping chunks predict for a step.

    Weights are ``exp(-coeff * i)`` with i = 0 for the oldest prediction, as in the ACT paper
    (coeff 0.01 there). Keeps a running average per future step, so each update is O(chunk).
    """

    def __init__(self, temporal_ensemble_coeff: float, chunk_size: int) -> None:
        self.chunk_size = chunk_size
        self.ensemble_weights = torch.exp(-temporal_ensemble_coeff * torch.arange(chunk_size))
        self.ensemble_weights_cumsum = torch.cumsum(self.ensemble_weights, dim=0)
        self.reset()

    def reset(self) -> None:
        self.ensembled_actions: Tensor | None = None
        self.ensembled_actions_count: Tensor | None = None

    def update(self, actions: Tensor) -> Tensor:
        """Fold in a new chunk (B, chunk_size, action_dim); return the action for this step (B, action_dim)."""
        weights = self.ensemble_weights.to(actions.device)
        weights_cumsum = self.ensemble_weights_cumsum.to(actions.device)
        if self.ensembled_actions is None:
            self.ensembled_actions = actions.clone()
            self.ensembled_actions_count = torch.ones(
                (self.chunk_size, 1), dtype=torch.long, device=actions.device
            )
        else:
            count = self.ensembled_actions_count
            ensembled = self.ensembled_actions * weights_cumsum[count - 1]
            ensembled = ensembled + actions[:, :-1] * weights[count]
            ensembled = ensembled / weights_cumsum[count]
            count = torch.clamp(count + 1, max=self.chunk_size)
            self.ensembled_actions = torch.cat([ensembled, actions[:, -1:]], dim=1)
            self.ensembled_actions_count = torch.cat([count, torch.ones_like(count[-1:])])
        action = self.ensembled_actions[:, 0]
        self.ensembled_actions = self.ensembled_actions[:, 1:]
        self.ensembled_actions_count = self.ensembled_actions_count[1:]
        return action


class ACTPolicy(PreTrainedPolicy):
    """ACT as a policy: training loss, chunk prediction and step-wise action selection.

    Batches are already normalized: ``observation.images.<camera>`` (B, 3, H, W) for each
    camera and/or ``observation.environment_state`` (B, env_dim), optionally
    ``observation.state`` (B, state_dim), and for training ``action``
    (B, chunk_size, action_dim) with ``action_is_pad`` (B, chunk_size).
    """

    config_class = ACTConfig
    name = "act"
    # Transformer layers, and each residual block of the camera backbone (docs/vision.md).
    _fsdp_wrap_modules = [
        "ACTEncoderLayer",
        "ACTDecoderLayer",
        BasicBlock.__name__,
        Bottleneck.__name__,
    ]
    # The feed-forward projections: nn.MultiheadAttention's out_proj bypasses its forward.
    _peft_target_modules = ["linear1", "linear2"]

    def __init__(self, config: ACTConfig, *, pretrained_parts: bool = True) -> None:
        super().__init__(config, pretrained_parts=pretrained_parts)
        self.config: ACTConfig
        self.model = ACT(config, pretrained_backbone=pretrained_parts)
        self.temporal_ensembler: ACTTemporalEnsembler | None = None
        if config.temporal_ensemble_coeff is not None:
            self.temporal_ensembler = ACTTemporalEnsembler(
                config.temporal_ensemble_coeff, config.chunk_size
            )
        self._action_queue: deque[Tensor] = deque(maxlen=config.n_action_steps)

    def reset(self) -> None:
        if self.temporal_ensembler is not None:
            self.temporal_ensembler.reset()
        self._action_queue.clear()

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        """(B, chunk_size, action_dim) normalized actions; switches the policy to eval mode."""
        self.eval()
        return self.model(batch)[0]

    @torch.no_grad()
    def select_action(self, batch: dict[str, Tensor]) -> Tensor:
        """The next normalized action (B, action_dim); switches the policy to eval mode.

        With temporal ensembling the network runs every step; otherwise it runs once per
        ``n_action_steps`` and the chunk's first actions are queued. Call ``reset`` at each
        episode start.
        """
        if self.temporal_ensembler is not None:
            return self.temporal_ensembler.update(self.predict_action_chunk(batch))
        if not self._action_queue:
            actions = self.predict_action_chunk(batch)[:, : self.config.n_action_steps]
            self._action_queue.extend(actions.transpose(0, 1))
        return self._action_queue.popleft()

    def get_optim_params(self) -> list[dict]:
        """LeRobot's two parameter groups: everything but the vision backbone, and the backbone
        at ``optimizer_lr_backbone`` (an empty group without cameras, as LeRobot writes it)."""
        named = [(n, p) for n, p in self.named_parameters() if p.requires_grad]
        return [
            {"params": [p for n, p in named if not n.startswith(BACKBONE_PREFIX)]},
            {
                "params": [p for n, p in named if n.startswith(BACKBONE_PREFIX)],
                "lr": self.config.optimizer_lr_backbone,
            },
        ]

    def loss_normalizers(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """The L1 term averages over the non-padded action values: their count in ``batch``."""
        valid = (~_require(batch, ACTION_IS_PAD).bool()).sum()
        return {"l1": valid * self.config.action_feature["shape"][0]}

    def forward(
        self,
        batch: dict[str, Tensor],
        normalizers: dict[str, tuple[Tensor, int]] | None = None,
        reduction: str = "mean",
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Loss = L1 averaged over the non-padded action values (LeRobot 0.6.1), plus
        kl_weight * KL (summed over latent dims, averaged over the batch) when the VAE ran.

        ``normalizers["l1"] = (total, shares)``: the count of :meth:`loss_normalizers` over a
        whole data-parallel, accumulated batch and the number of parts it is split into; the L1
        sum is then divided by total / shares instead of this part's own count.

        ``reduction="none"`` (LeRobot's convention for a per-sample loss): the loss of each
        sample instead, (B,): its L1 averaged over its own non-padded action values, plus
        kl_weight * its KL when the VAE ran (the held-out loss, in eval mode, has no VAE term)."""
        if reduction not in ("mean", "none"):
            raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
        target = _require(batch, ACTION)
        action_is_pad = _require(batch, ACTION_IS_PAD)
        expected = (self.config.chunk_size, self.config.action_feature["shape"][0])
        if target.dim() != 3 or tuple(target.shape[1:]) != expected:
            raise ValueError(
                f"batch[{ACTION!r}] must have shape (B, {expected[0]}, {expected[1]}) "
                f"(chunk_size, action_dim), got {tuple(target.shape)}"
            )
        actions_hat, (mu, log_sigma_x2) = self.model(batch)
        valid = ~action_is_pad.bool().unsqueeze(-1)
        abs_err = F.l1_loss(target, actions_hat, reduction="none")
        if reduction == "none":
            counts = (valid.sum(dim=(1, 2)) * abs_err.shape[-1]).clamp_min(1)
            losses = (abs_err * valid).sum(dim=(1, 2)) / counts
            if mu is not None:
                kld = (-0.5 * (1 + log_sigma_x2 - mu.pow(2) - log_sigma_x2.exp())).sum(-1)
                losses = losses + kld * self.config.kl_weight
            return losses, {}
        if normalizers is not None and "l1" in normalizers:
            total, shares = normalizers["l1"]
            denominator = total.float().clamp_min(1) / shares
        else:
            denominator = (valid.sum() * abs_err.shape[-1]).clamp_min(1)
        l1_loss = (abs_err * valid).sum() / denominator
        loss_dict = {"l1_loss": l1_loss.detach()}  # no .item(): no device sync per step
        if mu is None:
            return l1_loss, loss_dict
        kld_loss = (-0.5 * (1 + log_sigma_x2 - mu.pow(2) - log_sigma_x2.exp())).sum(-1).mean()
        loss_dict["kld_loss"] = kld_loss.detach()
        return l1_loss + kld_loss * self.config.kl_weight, loss_dict
