"""PaliGemma (SigLIP vision tower, projector, Gemma language model) with a Gemma action expert,
run layer pair by layer pair over two token streams: pi0's and pi0.5's backbone.

Stream 0 is the prefix (camera frames, then the prompt's tokens) through the language model's
layers; stream 1 is the suffix (pi0: the state token and the noisy action chunk; pi0.5: the
chunk) through the expert's. Layer ``i`` of both stacks is one *pair*: both streams' queries,
keys and values are concatenated along the sequence, one eager attention covers them (the mask
keeps the prefix from seeing the suffix), then each stream goes through its own layer's output
projection, residual, norm and MLP. pi0.5's expert norms are AdaRMS, conditioned on the flow
time (``dense``: scale, shift and a gate on the residual).

The decoder layers' own ``forward`` never runs (their parts are called directly, LeRobot's
numerics: RMSNorm in float32, eager attention with softmax in float32, an additive mask). Each
pair runs inside both its layers' *unit entries* instead (``layer.run_as_unit(fn, ...)``,
lerobot_pipe/distributed/unit_probe.py): each decoder layer can be an FSDP2 unit gathered
around the pair (with activation checkpointing: recomputed as one), and every parameter name is
LeRobot 0.6.1's. The token embedding and the two ``lm_head``s have classes of their own
(``PiTokenEmbedding``, ``PiLMHead``): the ``lm_head``s are units of their own, never used
(LeRobot keeps them in its checkpoints) and frozen; the embedding is sharded by rows and never
gathered (lerobot_pipe/distributed/vocab_parallel.py).

Sampling computes the prefix once and keeps every layer's keys (after RoPE) and values; each
denoising step runs the suffix through the expert alone against them.

Module names are LeRobot 0.6.1's (transformers 5.5's PaliGemma, LeRobot's PiGemma), and so is
the order in which parameters are registered (the optimizer files number them in that order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from lerobot_pipe.distributed.unit_probe import add_unit_entry
from lerobot_pipe.policies.pi0.configuration_pi0 import GemmaGeometry, SiglipGeometry

VOCAB_SIZE = 257_152
RMS_EPS = 1e-6
LAYER_NORM_EPS = 1e-6
ROPE_THETA = 10_000.0
# openpi's additive mask value (LeRobot's OPENPI_ATTENTION_MASK_VALUE).
MASK_VALUE = -2.3819763e38
# Parameter names LeRobot's dtype=bfloat16 keeps in float32 (substrings of the names under
# ``paligemma_with_expert``).
KEEP_FLOAT32 = (
    "vision_tower",
    "multi_modal_projector",
    "input_layernorm",
    "post_attention_layernorm",
    "model.norm",
)


def gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


def _init_linear(layer: nn.Linear, std: float = 0.02) -> nn.Linear:
    nn.init.normal_(layer.weight, std=std)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


# --- Gemma ------------------------------------------------------------------------------------


class PiRMSNorm(nn.Module):
    """Gemma's RMSNorm (``x / rms(x) * (1 + weight)``, in float32), or, with ``cond_dim``,
    AdaRMS: ``dense(cond)`` gives a scale, a shift and a gate (for the residual that follows).
    Returns (normed, gate or None)."""

    def __init__(self, dim: int, cond_dim: int | None = None, eps: float = RMS_EPS) -> None:
        super().__init__()
        self.eps = eps
        self.cond_dim = cond_dim
        if cond_dim is None:
            self.weight = nn.Parameter(torch.zeros(dim))
            self.dense = None
        else:
            self.dense = nn.Linear(cond_dim, 3 * dim)
            nn.init.zeros_(self.dense.weight)

    def forward(self, x: Tensor, cond: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        variance = torch.mean(torch.square(x.float()), dim=-1, keepdim=True)
        normed = x * torch.rsqrt(variance + self.eps)
        if self.dense is None:
            return (normed * (1.0 + self.weight.float())).type_as(x), None
        if cond is None:
            raise ValueError("an AdaRMS norm needs its condition (the flow time's embedding)")
        modulation = self.dense(cond.to(self.dense.weight.dtype))
        if x.dim() == 3:
            modulation = modulation[:, None]
        scale, shift, gate = modulation.chunk(3, dim=-1)
        normed = normed * (1 + scale.float()) + shift.float()
        return normed.to(x.dtype), gate.to(x.dtype)


def gated_residual(x: Tensor, y: Tensor, gate: Tensor | None) -> Tensor:
    return x + y if gate is None else x + y * gate


class GemmaAttention(nn.Module):
    def __init__(self, geometry: GemmaGeometry) -> None:
        super().__init__()
        g = geometry
        self.head_dim = g.head_dim
        self.num_heads = g.num_heads
        self.num_kv_heads = g.num_kv_heads
        self.scaling = g.head_dim**-0.5
        self.q_proj = _init_linear(nn.Linear(g.width, g.num_heads * g.head_dim, bias=False))
        self.k_proj = _init_linear(nn.Linear(g.width, g.num_kv_heads * g.head_dim, bias=False))
        self.v_proj = _init_linear(nn.Linear(g.width, g.num_kv_heads * g.head_dim, bias=False))
        self.o_proj = _init_linear(nn.Linear(g.num_heads * g.head_dim, g.width, bias=False))


class GemmaMLP(nn.Module):
    def __init__(self, geometry: GemmaGeometry) -> None:
        super().__init__()
        self.gate_proj = _init_linear(nn.Linear(geometry.width, geometry.mlp_dim, bias=False))
        self.up_proj = _init_linear(nn.Linear(geometry.width, geometry.mlp_dim, bias=False))
        self.down_proj = _init_linear(nn.Linear(geometry.mlp_dim, geometry.width, bias=False))

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(gelu_tanh(self.gate_proj(x)) * self.up_proj(x))


class PiGemmaDecoderLayer(nn.Module):
    """One Gemma decoder layer; its work runs through its unit entry (module docstring)."""

    def __init__(self, geometry: GemmaGeometry, cond_dim: int | None) -> None:
        super().__init__()
        self.self_attn = GemmaAttention(geometry)
        self.mlp = GemmaMLP(geometry)
        self.input_layernorm = PiRMSNorm(geometry.width, cond_dim)
        self.post_attention_layernorm = PiRMSNorm(geometry.width, cond_dim)
        add_unit_entry(self)

    def qkv(self, hidden: Tensor, cond: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(B, H, L, D) queries, keys, values (before RoPE) and the input norm's gate."""
        normed, gate = self.input_layernorm(hidden, cond)
        attn = self.self_attn
        x = normed.to(attn.q_proj.weight.dtype)
        shape = (*x.shape[:-1], -1, attn.head_dim)
        return (
            attn.q_proj(x).view(shape).transpose(1, 2),
            attn.k_proj(x).view(shape).transpose(1, 2),
            attn.v_proj(x).view(shape).transpose(1, 2),
            gate,
        )

    def finish(
        self, attended: Tensor, hidden: Tensor, gate: Tensor | None, cond: Tensor | None
    ) -> Tensor:
        """Output projection, gated residual, post-attention norm, MLP, gated residual."""
        out = self.self_attn.o_proj(attended.to(self.self_attn.o_proj.weight.dtype))
        out = gated_residual(hidden, out, gate)
        normed, gate = self.post_attention_layernorm(out, cond)
        mlp = self.mlp(normed.to(self.mlp.up_proj.weight.dtype))
        return gated_residual(out, mlp, gate)


class PiTokenEmbedding(nn.Embedding):
    """Gemma's token embedding, scaled by sqrt(width) (in the rows' dtype: the weight's, or the
    compute dtype of a sharded one). Under FSDP2 it is vocab-parallel
    (lerobot_pipe/distributed/vocab_parallel.py): sharded by rows, never gathered."""

    fsdp_vocab_parallel = True

    def __init__(self, vocab: int, width: int, padding_idx: int = 0) -> None:
        super().__init__(vocab, width, padding_idx)
        self.scale = float(width) ** 0.5

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=0.02)
        self._fill_padding_idx_with_zero()

    def forward(self, tokens: Tensor) -> Tensor:
        return self.finish_lookup(super().forward(tokens))

    def finish_lookup(self, rows: Tensor) -> Tensor:
        # The scale as a float32 tensor cast to the rows' dtype, as transformers' Gemma.
        return rows * torch.tensor(self.scale, device=rows.device).to(rows.dtype)


class PiLMHead(nn.Linear):
    """A language model head: kept in checkpoints (LeRobot loads it), never used, frozen."""

    def __init__(self, width: int, vocab: int) -> None:
        super().__init__(width, vocab, bias=False)
        nn.init.normal_(self.weight, std=0.02)
        self.requires_grad_(False)


class PiGemmaModel(nn.Module):
    """A Gemma stack (LeRobot's PiGemmaModel): embeddings (the language model's only), decoder
    layers, final norm (AdaRMS where ``cond_dim``)."""

    def __init__(self, geometry: GemmaGeometry, cond_dim: int | None, embeddings: bool) -> None:
        super().__init__()
        self.embed_tokens = PiTokenEmbedding(VOCAB_SIZE, geometry.width) if embeddings else None
        self.layers = nn.ModuleList(
            PiGemmaDecoderLayer(geometry, cond_dim) for _ in range(geometry.depth)
        )
        self.norm = PiRMSNorm(geometry.width, cond_dim)


class PiGemmaForCausalLM(nn.Module):
    """The expert: a Gemma stack and its (unused) ``lm_head``."""

    def __init__(self, geometry: GemmaGeometry, cond_dim: int | None) -> None:
        super().__init__()
        self.lm_head = PiLMHead(geometry.width, VOCAB_SIZE)
        self.model = PiGemmaModel(geometry, cond_dim, embeddings=False)


# --- SigLIP -----------------------------------------------------------------------------------


class SiglipVisionEmbeddings(nn.Module):
    def __init__(self, geometry: SiglipGeometry, image_size: int) -> None:
        super().__init__()
        g = geometry
        self.patch_embedding = nn.Conv2d(3, g.hidden_size, g.patch_size, stride=g.patch_size)
        self.num_patches = (image_size // g.patch_size) ** 2
        self.position_embedding = nn.Embedding(self.num_patches, g.hidden_size)

    def forward(self, pixels: Tensor) -> Tensor:
        weight = self.patch_embedding.weight
        patches = self.patch_embedding(pixels.to(weight.dtype)).flatten(2).transpose(1, 2)
        if patches.shape[1] != self.num_patches:
            raise ValueError(
                f"frames give {patches.shape[1]} patches, the vision tower has "
                f"{self.num_patches} positions (image_resolution must match the frames)"
            )
        ids = torch.arange(self.num_patches, device=patches.device)
        return patches + self.position_embedding(ids)[None]


class SiglipAttention(nn.Module):
    def __init__(self, geometry: SiglipGeometry) -> None:
        super().__init__()
        width = geometry.hidden_size
        self.num_heads = geometry.num_heads
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.q_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        shape = (*x.shape[:-1], self.num_heads, -1)
        q, k, v = (
            p(x).view(shape).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(*x.shape[:-1], -1))


class SiglipMLP(nn.Module):
    def __init__(self, geometry: SiglipGeometry) -> None:
        super().__init__()
        self.fc1 = nn.Linear(geometry.hidden_size, geometry.intermediate_size)
        self.fc2 = nn.Linear(geometry.intermediate_size, geometry.hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(gelu_tanh(self.fc1(x)))


class SiglipEncoderLayer(nn.Module):
    def __init__(self, geometry: SiglipGeometry) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(geometry.hidden_size, eps=LAYER_NORM_EPS)
        self.self_attn = SiglipAttention(geometry)
        self.layer_norm2 = nn.LayerNorm(geometry.hidden_size, eps=LAYER_NORM_EPS)
        self.mlp = SiglipMLP(geometry)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipEncoder(nn.Module):
    def __init__(self, geometry: SiglipGeometry) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            SiglipEncoderLayer(geometry) for _ in range(geometry.num_layers)
        )


class SiglipVisionTransformer(nn.Module):
    def __init__(self, geometry: SiglipGeometry, image_size: int) -> None:
        super().__init__()
        self.embeddings = SiglipVisionEmbeddings(geometry, image_size)
        self.encoder = SiglipEncoder(geometry)
        self.post_layernorm = nn.LayerNorm(geometry.hidden_size, eps=LAYER_NORM_EPS)

    def forward(self, pixels: Tensor) -> Tensor:
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)


class SiglipVisionModel(nn.Module):
    def __init__(self, geometry: SiglipGeometry, image_size: int) -> None:
        super().__init__()
        self.vision_model = SiglipVisionTransformer(geometry, image_size)


class PaliGemmaMultiModalProjector(nn.Module):
    def __init__(self, vision_width: int, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(vision_width, width)


class PaliGemmaModel(nn.Module):
    def __init__(self, vision: SiglipGeometry, image_size: int, text: GemmaGeometry) -> None:
        super().__init__()
        self.vision_tower = SiglipVisionModel(vision, image_size)
        self.multi_modal_projector = PaliGemmaMultiModalProjector(vision.hidden_size, text.width)
        self.language_model = PiGemmaModel(text, None, embeddings=True)


class PaliGemmaForConditionalGeneration(nn.Module):
    def __init__(self, vision: SiglipGeometry, image_size: int, text: GemmaGeometry) -> None:
        super().__init__()
        self.lm_head = PiLMHead(text.width, VOCAB_SIZE)
        self.model = PaliGemmaModel(vision, image_size, text)


# --- the two stacks, pair by pair -----------------------------------------------------------


def rotary(positions: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """(cos, sin), (B, 1, L, dim) float32, of the rotary embedding at integer ``positions``
    (B, L) (transformers' Gemma: computed in float32); once per forward, for every layer."""
    inv_freq = 1.0 / (
        ROPE_THETA
        ** (torch.arange(0, dim, 2, dtype=torch.int64, device=positions.device).float() / dim)
    )
    freqs = positions.float()[:, :, None] * inv_freq[None, None, :]
    angles = torch.cat([freqs, freqs], dim=-1)
    return angles.cos()[:, None], angles.sin()[:, None]


def rope(x: Tensor, rot: tuple[Tensor, Tensor]) -> Tensor:
    """``rotary``'s (cos, sin), cast to ``x``'s dtype, applied to (B, H, L, D): halves
    rotated."""
    cos, sin = rot[0].to(x.dtype), rot[1].to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def additive_mask(mask: Tensor) -> Tensor:
    """(B, Lq, Lk) bool -> (B, 1, Lq, Lk) float32: 0 where seen, openpi's large negative value
    elsewhere."""
    return torch.where(mask[:, None], 0.0, MASK_VALUE)


def attend(attn: GemmaAttention, query: Tensor, key: Tensor, value: Tensor, mask: Tensor) -> Tensor:
    """Eager attention (transformers' Gemma): (B, H, Lq, D) x (B, KV, Lk, D) -> (B, Lq, H*D)."""
    groups = attn.num_heads // attn.num_kv_heads
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * attn.scaling + mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(probs, value).transpose(1, 2)
    return out.reshape(*out.shape[:2], -1)


@dataclass
class PrefixCache:
    """Each language-model layer's prefix keys (after RoPE) and values, (B, KV, P, D)."""

    keys: list[Tensor]
    values: list[Tensor]


class PaliGemmaWithExpertModel(nn.Module):
    """``paligemma`` and ``gemma_expert`` (LeRobot's names); see the module docstring."""

    def __init__(
        self,
        text: GemmaGeometry,
        expert: GemmaGeometry,
        vision: SiglipGeometry,
        image_size: int,
        *,
        adarms: bool,
        freeze_vision_encoder: bool = False,
        train_expert_only: bool = False,
    ) -> None:
        super().__init__()
        self.paligemma = PaliGemmaForConditionalGeneration(vision, image_size, text)
        self.gemma_expert = PiGemmaForCausalLM(expert, expert.width if adarms else None)
        self.freeze_vision_encoder = freeze_vision_encoder
        self.train_expert_only = train_expert_only
        self._freeze()

    @property
    def language_model(self) -> PiGemmaModel:
        return self.paligemma.model.language_model

    @property
    def expert(self) -> PiGemmaModel:
        return self.gemma_expert.model

    def _freeze(self) -> None:
        """The parameters that never get a gradient are frozen: the two lm_heads (never used),
        and the language model's last layer after its keys and values and its final norm (the
        prefix's output feeds nothing); then the parts the config freezes."""
        last = self.language_model.layers[-1]
        for part in (last.self_attn.o_proj, last.post_attention_layernorm, last.mlp):
            part.requires_grad_(False)
        self.language_model.norm.requires_grad_(False)
        if self.freeze_vision_encoder:
            self.paligemma.model.vision_tower.requires_grad_(False)
        if self.train_expert_only:
            self.paligemma.requires_grad_(False)

    def train(self, mode: bool = True) -> PaliGemmaWithExpertModel:
        super().train(mode)
        if self.freeze_vision_encoder:
            self.paligemma.model.vision_tower.eval()
        if self.train_expert_only:
            self.paligemma.eval()
        return self

    def to_bfloat16_for_selected_params(self) -> None:
        """LeRobot's dtype=bfloat16: everything in bf16 except the names in KEEP_FLOAT32."""
        self.to(torch.bfloat16)
        for name, param in self.named_parameters():
            if any(part in name for part in KEEP_FLOAT32):
                param.data = param.data.float()

    # --- embeddings -----------------------------------------------------------------------

    def embed_image(self, image: Tensor) -> Tensor:
        """(B, 3, H, W) in [-1, 1] -> (B, patches, width), in the image's dtype."""
        model = self.paligemma.model
        features = model.multi_modal_projector.linear(model.vision_tower.vision_model(image))
        return features.to(image.dtype)

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        return self.language_model.embed_tokens(tokens)

    # --- one pair's work, run inside both layers' unit entries ----------------------------

    def _pair(
        self,
        i: int,
        prefix: Tensor,
        suffix: Tensor,
        mask: Tensor,
        rot: tuple[Tensor, Tensor],
        cond: Tensor | None,
    ) -> tuple[Tensor | None, Tensor]:
        lm, ex = self.language_model.layers[i], self.expert.layers[i]
        q0, k0, v0, gate0 = lm.qkv(prefix, None)
        q1, k1, v1, gate1 = ex.qkv(suffix, cond)
        query = rope(torch.cat([q0, q1], dim=2), rot)
        key = rope(torch.cat([k0, k1], dim=2), rot)
        value = torch.cat([v0, v1], dim=2)
        att = attend(lm.self_attn, query, key, value, mask)
        p = prefix.shape[1]
        suffix = ex.finish(att[:, p:], suffix, gate1, cond)
        if i == len(self.language_model.layers) - 1:
            return None, suffix  # the last layer's prefix output feeds nothing
        return lm.finish(att[:, :p], prefix, gate0, None), suffix

    def _prefix_layer(
        self, i: int, prefix: Tensor, mask: Tensor, rot: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        layer = self.language_model.layers[i]
        q, k, v, gate = layer.qkv(prefix, None)
        q, k = rope(q, rot), rope(k, rot)
        v = v.contiguous()  # a unit's outputs are no views (FSDP2 hooks them)
        if i == len(self.language_model.layers) - 1:
            return k, v, None  # the last layer's prefix output feeds nothing
        return k, v, layer.finish(attend(layer.self_attn, q, k, v, mask), prefix, gate, None)

    def _suffix_layer(
        self,
        i: int,
        keys: Tensor,
        values: Tensor,
        suffix: Tensor,
        mask: Tensor,
        rot: tuple[Tensor, Tensor],
        cond: Tensor | None,
    ) -> Tensor:
        layer = self.expert.layers[i]
        q, k, v, gate = layer.qkv(suffix, cond)
        q, k = rope(q, rot), rope(k, rot)
        key = torch.cat([keys, k.to(keys.dtype)], dim=2)
        value = torch.cat([values, v.to(values.dtype)], dim=2)
        return layer.finish(attend(layer.self_attn, q, key, value, mask), suffix, gate, cond)

    def _bf16_stream(self, x: Tensor) -> Tensor:
        # LeRobot's dtype=bfloat16 runs both streams in bf16 from the first layer on.
        if self.language_model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16:
            return x.to(torch.bfloat16)
        return x

    # --- the entry points -------------------------------------------------------------------

    def forward_joint(
        self,
        prefix: Tensor,
        suffix: Tensor,
        mask: Tensor,
        positions: Tensor,
        cond: Tensor | None = None,
    ) -> Tensor:
        """Training: both streams through every pair; the suffix's final (normed) states.
        ``mask`` (B, P+S, P+S) bool, ``positions`` (B, P+S), ``cond`` (B, width) for AdaRMS."""
        prefix, suffix = self._bf16_stream(prefix), self._bf16_stream(suffix)
        additive = additive_mask(mask)
        rot = rotary(positions, self.language_model.layers[0].self_attn.head_dim)
        for i, (lm, ex) in enumerate(
            zip(self.language_model.layers, self.expert.layers, strict=True)
        ):
            prefix, suffix = lm.run_as_unit(
                ex.run_as_unit, self._pair, i, prefix, suffix, additive, rot, cond
            )
        return self.expert.norm(suffix, cond)[0]

    def encode_prefix(self, prefix: Tensor, mask: Tensor, positions: Tensor) -> PrefixCache:
        """Sampling, once per chunk: the prefix through the language model."""
        prefix = self._bf16_stream(prefix)
        additive = additive_mask(mask)
        rot = rotary(positions, self.language_model.layers[0].self_attn.head_dim)
        keys, values = [], []
        for i, layer in enumerate(self.language_model.layers):
            k, v, prefix = layer.run_as_unit(self._prefix_layer, i, prefix, additive, rot)
            keys.append(k)
            values.append(v)
        return PrefixCache(keys, values)

    def forward_suffix(
        self,
        cache: PrefixCache,
        suffix: Tensor,
        mask: Tensor,
        positions: Tensor,
        cond: Tensor | None = None,
    ) -> Tensor:
        """Sampling, once per denoising step: the suffix through the expert against the cached
        prefix. ``mask`` (B, S, P+S) bool, ``positions`` (B, S) continue the prefix's."""
        suffix = self._bf16_stream(suffix)
        additive = additive_mask(mask)
        rot = rotary(positions, self.expert.layers[0].self_attn.head_dim)
        for i, layer in enumerate(self.expert.layers):
            suffix = layer.run_as_unit(
                self._suffix_layer,
                i,
                cache.keys[i],
                cache.values[i],
                suffix,
                additive,
                rot,
                cond,
            )
        return self.expert.norm(suffix, cond)[0]
