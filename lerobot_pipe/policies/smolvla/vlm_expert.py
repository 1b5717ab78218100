"""The SmolVLM backbone and the action expert run layer by layer over two token streams.

Stream 0 is the prefix (camera frames, task tokens, state), run through the VLM's text layers;
stream 1 is the suffix (the noisy action chunk), run through the expert's layers. Each layer
index pairs one VLM layer with one expert layer. A pair is either

- *joint*: both streams' queries, keys and values are concatenated along the sequence and one
  masked attention covers them (the mask keeps the prefix from seeing the suffix), or
- *cross* (``attention_mode`` cross_attn, all but every ``self_attn_every_n_layers``-th pair):
  the prefix attends to itself; the expert's queries attend to the VLM layer's keys and values
  (after RoPE), projected to the expert by its own ``k_proj`` / ``v_proj`` (which therefore
  take the VLM's key/value width).

Each stream then goes through its own layer's output projection, residual and MLP. The layers'
submodules are called directly (LeRobot's numerics: eager attention in fp32, its RoPE); the
decoder layers' own ``forward`` never runs. Each layer's work runs through the layer's *unit
entry* instead (``layer.run_as_unit(fn, ...)``, lerobot_pipe/distributed/unit_probe.py), so that
every decoder layer can be an FSDP2 unit that gathers around it, with no module added and every
parameter name LeRobot's: a pair runs inside both its layers' entries, the prefix (sampling)
inside the VLM layer's alone, each denoising step inside the expert layers' alone.

Sampling computes the prefix once and keeps every layer's keys and values (``PrefixCache``);
each denoising step then runs the suffix alone against them.

Module names are LeRobot 0.6.1's: ``vlm`` (transformers' SmolVLMForConditionalGeneration with
its text layers cut to ``num_vlm_layers``) and ``lm_expert`` (a LlamaModel without embeddings).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from lerobot_pipe.distributed.meta_init import active_build
from lerobot_pipe.distributed.unit_probe import add_unit_entry
from lerobot_pipe.policies.smolvla.processor_smolvla import TRANSFORMERS_HINT


def _transformers():
    try:
        import transformers
    except ImportError as err:
        raise ImportError(TRANSFORMERS_HINT) from err
    return transformers


def vlm_weight_files(model_id: str) -> Path | dict[str, Path]:
    """The safetensors file(s) ``from_pretrained(model_id)`` reads (a Hub id through the
    cache, downloading what is missing, or a local folder): one file, or each key's shard of
    ``model.safetensors.index.json``."""
    import json

    from transformers.utils import cached_file

    found = cached_file(model_id, "model.safetensors", _raise_exceptions_for_missing_entries=False)
    if found is not None:
        return Path(found)
    index = cached_file(
        model_id, "model.safetensors.index.json", _raise_exceptions_for_missing_entries=False
    )
    if index is None:
        raise FileNotFoundError(
            f"{model_id} has neither model.safetensors nor model.safetensors.index.json"
        )
    weight_map = json.loads(Path(index).read_text())["weight_map"]
    shards = {name: Path(cached_file(model_id, name)) for name in sorted(set(weight_map.values()))}
    return {key: shards[name] for key, name in weight_map.items()}


def expert_intermediate_size(hidden: int, multiplier: int = 4, multiple_of: int = 256) -> int:
    """The expert MLP's width: 2/3 of ``multiplier * hidden``, rounded up to ``multiple_of``."""
    size = int(multiplier * int(2 * hidden / 3))
    return multiple_of * ((size + multiple_of - 1) // multiple_of)


def rotate(x: Tensor, positions: Tensor, max_wavelength: float = 10_000.0) -> Tensor:
    """RoPE on ``x`` (B, L, H, D) at ``positions`` (B, L), computed in fp32, halves layout."""
    half = x.shape[-1] // 2
    dtype = x.dtype
    x = x.float()
    exponents = torch.arange(half, dtype=torch.float32, device=x.device) * (2.0 / x.shape[-1])
    angles = positions[..., None].float() / (max_wavelength**exponents)[None, None, :]
    sin, cos = torch.sin(angles)[..., None, :], torch.cos(angles)[..., None, :]
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1).to(dtype)


@dataclass
class PrefixCache:
    """Per layer: the prefix's keys and values (B, P, kv_heads, head_dim), after RoPE."""

    keys: list[Tensor]
    values: list[Tensor]


class SmolVLMWithExpert(nn.Module):
    """``vlm`` + ``lm_expert``; see the module docstring."""

    def __init__(
        self,
        model_id: str,
        *,
        load_vlm_weights: bool,
        build_weights: bool = True,
        train_expert_only: bool,
        freeze_vision_encoder: bool,
        attention_mode: str,
        num_expert_layers: int,
        num_vlm_layers: int,
        self_attn_every_n_layers: int,
        expert_width_multiplier: float,
    ) -> None:
        super().__init__()
        tf = _transformers()
        # Where the VLM's weights are still to be read from (a meta build: each rank reads its
        # shards of them when it materializes, distributed/meta_init.py); None once in place.
        self.vlm_weights_from: str | None = None
        build = active_build() if load_vlm_weights and build_weights else None
        if build is not None:
            # What from_pretrained builds, without its weights and without drawing an
            # initialization for them (from_pretrained draws none for the weights it loads).
            with build.undrawn():
                config = tf.AutoConfig.from_pretrained(model_id)
                self.vlm = tf.AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
            self.vlm_weights_from = model_id
        elif load_vlm_weights and build_weights:
            self.vlm = tf.AutoModelForImageTextToText.from_pretrained(
                model_id, dtype=torch.bfloat16
            )
        else:
            config = tf.AutoConfig.from_pretrained(model_id)
            # A checkpoint about to be loaded over it: LeRobot's dtypes, none of the VLM's weights.
            dtype = torch.bfloat16 if load_vlm_weights else torch.float32
            self.vlm = tf.AutoModelForImageTextToText.from_config(config, dtype=dtype)
        vlm_dtype = next(self.vlm.parameters()).dtype
        text = self.vlm.model.text_model
        if num_vlm_layers > 0:
            text.layers = text.layers[:num_vlm_layers]
        self.num_vlm_layers = len(text.layers)
        text_config = self.vlm.config.text_config

        expert_config = copy.deepcopy(text_config)
        expert_config.hidden_size = int(text_config.hidden_size * expert_width_multiplier)
        expert_config.intermediate_size = expert_intermediate_size(expert_config.hidden_size)
        expert_config.num_hidden_layers = (
            num_expert_layers if num_expert_layers > 0 else self.num_vlm_layers
        )
        self.lm_expert = tf.AutoModel.from_config(expert_config, dtype=vlm_dtype)
        self.lm_expert.embed_tokens = None  # the expert reads embeddings, not tokens
        self.num_expert_layers = len(self.lm_expert.layers)

        self.cross = attention_mode == "cross_attn"
        self.self_attn_every_n_layers = self_attn_every_n_layers
        kv_width = text_config.num_key_value_heads * text_config.head_dim
        expert_kv = expert_config.num_key_value_heads * expert_config.head_dim
        for i, layer in enumerate(self.lm_expert.layers):
            if self._is_cross(i):
                bias = expert_config.attention_bias
                layer.self_attn.k_proj = nn.Linear(kv_width, expert_kv, bias=bias)
                layer.self_attn.v_proj = nn.Linear(kv_width, expert_kv, bias=bias)
        self.num_heads = text_config.num_attention_heads
        self.num_kv_heads = text_config.num_key_value_heads
        self.head_dim = text_config.head_dim
        self.hidden_size = text_config.hidden_size
        self.expert_hidden_size = expert_config.hidden_size
        self.freeze_vision_encoder = freeze_vision_encoder
        self.train_expert_only = train_expert_only
        # The layers' own forward never runs (their parts are called directly): each runs its
        # work through its unit entry, so that it can be an FSDP2 unit (unit_probe.py).
        for layer in [*text.layers, *self.lm_expert.layers]:
            add_unit_entry(layer)
        self._freeze()

    # --- structure ------------------------------------------------------------------------

    def _is_cross(self, i: int) -> bool:
        every = self.self_attn_every_n_layers
        return self.cross and not (every > 0 and i % every == 0)

    def expert_layer(self, i: int) -> nn.Module | None:
        """The expert layer paired with VLM layer ``i`` (None where a shorter expert skips)."""
        stride = self.num_vlm_layers // self.num_expert_layers
        if stride > 0 and i % stride:
            return None
        return self.lm_expert.layers[i // stride if stride > 0 else i]

    def _freeze(self) -> None:
        vision = self.vlm.model.vision_model
        if self.freeze_vision_encoder:
            vision.requires_grad_(False)
        if self.train_expert_only:
            self.vlm.requires_grad_(False)
        else:
            # Parameters that get no gradient (the last layer's output only feeds the unused
            # lm_head): frozen, as LeRobot does for DDP.
            last = [self.num_vlm_layers - 1]
            if (
                self.num_vlm_layers != self.num_expert_layers
                and self.num_vlm_layers % self.num_expert_layers == 0
            ):
                last.append(self.num_vlm_layers - 2)
            patterns = ["lm_head", "text_model.norm.weight"]
            patterns += [f"text_model.layers.{i}." for i in last]
            for name, param in self.vlm.named_parameters():
                if any(p in name for p in patterns):
                    param.requires_grad_(False)

    def train(self, mode: bool = True) -> SmolVLMWithExpert:
        super().train(mode)
        if self.freeze_vision_encoder:
            self.vlm.model.vision_model.eval()
        if self.train_expert_only:
            self.vlm.eval()
        return self

    # --- embeddings -----------------------------------------------------------------------

    def embed_image(self, image: Tensor) -> Tensor:
        """(B, 3, H, W) in [-1, 1] -> (B, tokens, hidden): vision tower and connector."""
        model = self.vlm.model
        vision_dtype = next(model.vision_model.parameters()).dtype
        hidden = model.vision_model(pixel_values=image.to(vision_dtype)).last_hidden_state
        return model.connector(hidden)

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        return self.vlm.model.text_model.get_input_embeddings()(tokens)

    # --- attention ------------------------------------------------------------------------

    def attend(self, mask: Tensor, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        """Eager attention: (B, Lq, H, D) x (B, Lk, kv_heads, D) -> (B, Lq, H * D), scores and
        softmax in fp32, masked scores at the dtype's minimum (fully masked rows: uniform)."""
        batch, length = key.shape[:2]
        groups = self.num_heads // self.num_kv_heads
        key = (
            key[:, :, :, None, :]
            .expand(-1, -1, -1, groups, -1)
            .reshape(batch, length, -1, key.shape[-1])
        )
        value = (
            value[:, :, :, None, :]
            .expand(-1, -1, -1, groups, -1)
            .reshape(batch, length, -1, value.shape[-1])
        )
        scores = torch.matmul(query.float().transpose(1, 2), key.float().permute(0, 2, 3, 1))
        scores = scores * self.head_dim**-0.5
        scores = torch.where(mask[:, None], scores, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1).to(value.dtype)
        out = torch.matmul(probs, value.transpose(1, 2)).transpose(1, 2)
        return out.reshape(batch, out.shape[1], -1)

    @staticmethod
    def _qkv(layer: nn.Module, hidden: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        attn = layer.self_attn
        x = layer.input_layernorm(hidden).to(attn.q_proj.weight.dtype)
        shape = (*x.shape[:-1], -1, attn.head_dim)
        return attn.q_proj(x).view(shape), attn.k_proj(x).view(shape), attn.v_proj(x).view(shape)

    @staticmethod
    def _finish(layer: nn.Module, attended: Tensor, hidden: Tensor) -> Tensor:
        """Output projection, residual, MLP, residual; each sum in the projection's dtype, as
        LeRobot's in-place sums give it (a bf16 layer keeps a float32 residual stream in bf16)."""
        out = layer.self_attn.o_proj(attended.to(layer.self_attn.o_proj.weight.dtype))
        out = (out + hidden).to(out.dtype)
        mlp = layer.mlp(layer.post_attention_layernorm(out))
        return (mlp + out).to(mlp.dtype)

    def _cross_expert(
        self,
        layer: nn.Module,
        suffix: Tensor,
        prefix_k: Tensor,
        prefix_v: Tensor,
        positions: Tensor,
        mask: Tensor,
    ) -> Tensor:
        """The expert's queries over the VLM layer's (projected) keys and values."""
        attn = layer.self_attn
        x = layer.input_layernorm(suffix).to(attn.q_proj.weight.dtype)
        query = attn.q_proj(x).view(*x.shape[:-1], -1, attn.head_dim)
        flat_k = prefix_k.to(attn.k_proj.weight.dtype).reshape(*prefix_k.shape[:2], -1)
        flat_v = prefix_v.to(attn.v_proj.weight.dtype).reshape(*prefix_v.shape[:2], -1)
        key = attn.k_proj(flat_k).view(*flat_k.shape[:-1], -1, attn.head_dim)
        value = attn.v_proj(flat_v).view(*flat_v.shape[:-1], -1, attn.head_dim)
        positions = positions - positions.min(dim=1, keepdim=True).values
        return self.attend(mask, rotate(query, positions), key, value)

    # --- one layer's work, each run through its layers' unit entries -------------------------

    def _pair_step(
        self, i: int, prefix: Tensor, suffix: Tensor, mask: Tensor, positions: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Training, layer pair ``i``: both streams through VLM layer ``i`` and its expert."""
        vlm_layer, expert = self.vlm.model.text_model.layers[i], self.expert_layer(i)
        p = prefix.shape[1]
        q0, k0, v0 = self._qkv(vlm_layer, prefix)
        if self._is_cross(i):
            pos0 = positions[:, :p]
            k0 = rotate(k0, pos0)
            att0 = self.attend(mask[:, :p, :p], rotate(q0, pos0), k0, v0)
            att1 = self._cross_expert(
                expert, suffix, k0, v0, positions[:, p:], mask[:, -suffix.shape[1] :, :p]
            )
            return self._finish(vlm_layer, att0, prefix), self._finish(expert, att1, suffix)
        q1, k1, v1 = self._qkv(expert, suffix)
        query = rotate(torch.cat([q0, q1], dim=1), positions)
        key = rotate(torch.cat([k0, k1], dim=1), positions)
        att = self.attend(mask, query, key, torch.cat([v0, v1], dim=1))
        return self._finish(vlm_layer, att[:, :p], prefix), self._finish(expert, att[:, p:], suffix)

    def _prefix_step(
        self, i: int, prefix: Tensor, mask: Tensor, positions: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The prefix alone through VLM layer ``i``: (its keys after RoPE, values, output)."""
        layer = self.vlm.model.text_model.layers[i]
        q, k, v = self._qkv(layer, prefix)
        k = rotate(k, positions)
        return k, v, self._finish(layer, self.attend(mask, rotate(q, positions), k, v), prefix)

    def _suffix_step(
        self, i: int, keys: Tensor, values: Tensor, suffix: Tensor, mask: Tensor, positions: Tensor
    ) -> Tensor:
        """Sampling: the suffix through the expert paired with VLM layer ``i``, against that
        layer's cached prefix keys and values."""
        expert = self.expert_layer(i)
        if self._is_cross(i):
            att = self._cross_expert(
                expert, suffix, keys, values, positions, mask[:, :, : keys.shape[1]]
            )
        else:
            q, k, v = self._qkv(expert, suffix)
            key = torch.cat([keys, rotate(k, positions)], dim=1)
            value = torch.cat([values, v], dim=1)
            att = self.attend(mask, rotate(q, positions), key, value)
        return self._finish(expert, att, suffix)

    # --- the two entry points ---------------------------------------------------------------

    def forward_joint(
        self,
        prefix: Tensor,
        suffix: Tensor,
        mask: Tensor,
        positions: Tensor,
        first_live: int | None = None,
    ) -> Tensor:
        """Training: both streams through every layer pair; returns the suffix's final
        (normed) hidden states. ``mask`` (B, P+S, P+S) bool, ``positions`` (B, P+S).

        ``first_live``: the prefix row where the rows that may carry a gradient begin (the
        state token, which no earlier prefix row attends to: frames and task tokens form the
        block before it). With the VLM's text layers frozen, the rows before it need no
        gradient (nothing trainable feeds them), so they run without autograd: the backward
        then goes through the frozen layers for the state row alone, not for every frame
        and task token (see :meth:`_split_pair_step`)."""
        text = self.vlm.model.text_model
        p = prefix.shape[1]
        if self._splits(prefix, first_live):
            return self._forward_joint_split(prefix, suffix, mask, positions, first_live)
        for i in range(self.num_vlm_layers):
            vlm_layer, expert = text.layers[i], self.expert_layer(i)
            if expert is None:
                _, _, prefix = vlm_layer.run_as_unit(
                    self._prefix_step, i, prefix, mask[:, :p, :p], positions[:, :p]
                )
                continue
            # Inside both layers' units (FSDP2 gathers each around its entry).
            prefix, suffix = vlm_layer.run_as_unit(
                expert.run_as_unit, self._pair_step, i, prefix, suffix, mask, positions
            )
        return self.lm_expert.norm(suffix)

    def _splits(self, prefix: Tensor, first_live: int | None) -> bool:
        return (
            first_live is not None
            and 0 < first_live < prefix.shape[1]
            and torch.is_grad_enabled()
            and prefix.requires_grad
            and not any(p.requires_grad for p in self.vlm.model.text_model.layers.parameters())
        )

    def _forward_joint_split(
        self, prefix: Tensor, suffix: Tensor, mask: Tensor, positions: Tensor, s: int
    ) -> Tensor:
        text = self.vlm.model.text_model
        p = prefix.shape[1]
        fixed, live = prefix[:, :s].detach(), prefix[:, s:]
        for i in range(self.num_vlm_layers):
            vlm_layer, expert = text.layers[i], self.expert_layer(i)
            if expert is None:
                fixed, live = vlm_layer.run_as_unit(
                    self._split_prefix_step, i, fixed, live, mask[:, :p, :p], positions[:, :p]
                )
                continue
            fixed, live, suffix = vlm_layer.run_as_unit(
                expert.run_as_unit, self._split_pair_step, i, fixed, live, suffix, mask, positions
            )
        return self.lm_expert.norm(suffix)

    def _split_qkv(self, layer: nn.Module, fixed: Tensor, live: Tensor, positions: Tensor):
        """The prefix's queries (after RoPE) of the fixed and the live rows, and the keys
        (after RoPE) and values of all its rows; the fixed rows' without autograd."""
        s, p = fixed.shape[1], fixed.shape[1] + live.shape[1]
        with torch.no_grad():
            qf, kf, vf = self._qkv(layer, fixed)
            qf, kf = rotate(qf, positions[:, :s]), rotate(kf, positions[:, :s])
        ql, kl, vl = self._qkv(layer, live)
        ql, kl = rotate(ql, positions[:, s:p]), rotate(kl, positions[:, s:p])
        return qf, ql, torch.cat([kf, kl], dim=1), torch.cat([vf, vl], dim=1)

    def _fixed_rows(self, layer, fixed: Tensor, qf: Tensor, k0: Tensor, v0: Tensor, mask):
        """The fixed rows through the rest of the layer, without autograd: they attend only to
        fixed rows (the block structure of the mask)."""
        s = fixed.shape[1]
        with torch.no_grad():
            att = self.attend(mask[:, :s, :s], qf, k0[:, :s], v0[:, :s])
            return self._finish(layer, att, fixed)

    def _split_pair_step(
        self,
        i: int,
        fixed: Tensor,
        live: Tensor,
        suffix: Tensor,
        mask: Tensor,
        positions: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`_pair_step` with the prefix in two parts: the fixed rows (before
        ``first_live``) without autograd, the live rows and the suffix with it. The same
        arithmetic row by row: a fixed row's masked-out columns (the live rows) weigh exactly
        0 in its softmax, so leaving them out changes its value by rounding at most (the
        matrix products' blocking); rows that attend to nothing (padding: uniform over
        whatever columns there are) are never attended to, so their values reach nothing."""
        vlm_layer, expert = self.vlm.model.text_model.layers[i], self.expert_layer(i)
        s, p = fixed.shape[1], fixed.shape[1] + live.shape[1]
        qf, ql, k0, v0 = self._split_qkv(vlm_layer, fixed, live, positions[:, :p])
        fixed_out = self._fixed_rows(vlm_layer, fixed, qf, k0, v0, mask)
        if self._is_cross(i):
            att_live = self.attend(mask[:, s:p, :p], ql, k0, v0)
            att1 = self._cross_expert(
                expert, suffix, k0, v0, positions[:, p:], mask[:, -suffix.shape[1] :, :p]
            )
            return (
                fixed_out,
                self._finish(vlm_layer, att_live, live),
                self._finish(expert, att1, suffix),
            )
        q1, k1, v1 = self._qkv(expert, suffix)
        q1, k1 = rotate(q1, positions[:, p:]), rotate(k1, positions[:, p:])
        query = torch.cat([ql, q1], dim=1)
        att = self.attend(
            mask[:, s:], query, torch.cat([k0, k1], dim=1), torch.cat([v0, v1], dim=1)
        )
        n = live.shape[1]
        return (
            fixed_out,
            self._finish(vlm_layer, att[:, :n], live),
            self._finish(expert, att[:, n:], suffix),
        )

    def _split_prefix_step(
        self, i: int, fixed: Tensor, live: Tensor, mask: Tensor, positions: Tensor
    ) -> tuple[Tensor, Tensor]:
        """:meth:`_prefix_step` (a VLM layer without an expert) with the prefix in two parts."""
        layer = self.vlm.model.text_model.layers[i]
        s = fixed.shape[1]
        qf, ql, k0, v0 = self._split_qkv(layer, fixed, live, positions)
        fixed_out = self._fixed_rows(layer, fixed, qf, k0, v0, mask)
        return fixed_out, self._finish(layer, self.attend(mask[:, s:], ql, k0, v0), live)

    def encode_prefix(self, prefix: Tensor, mask: Tensor, positions: Tensor) -> PrefixCache:
        """Sampling, once per chunk: the prefix through the VLM; every layer's keys/values."""
        text = self.vlm.model.text_model
        keys, values = [], []
        for i, layer in enumerate(text.layers):
            k, v, prefix = layer.run_as_unit(self._prefix_step, i, prefix, mask, positions)
            keys.append(k)
            values.append(v)
        return PrefixCache(keys, values)

    def forward_suffix(
        self, cache: PrefixCache, suffix: Tensor, mask: Tensor, positions: Tensor
    ) -> Tensor:
        """Sampling, once per denoising step: the suffix through the expert against the cached
        prefix. ``mask`` (B, S, P+S), ``positions`` (B, S) continue the prefix's."""
        for i in range(self.num_vlm_layers):
            expert = self.expert_layer(i)
            if expert is None:
                continue
            suffix = expert.run_as_unit(
                self._suffix_step, i, cache.keys[i], cache.values[i], suffix, mask, positions
            )
        return self.lm_expert.norm(suffix)
