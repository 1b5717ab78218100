"""ACT network and policy: shapes, gradients, loss, action selection, FSDP2 wrap units."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

from lerobot_pipe.policies.act import (
    ACT,
    ACTConfig,
    ACTDecoder,
    ACTDecoderLayer,
    ACTEncoder,
    ACTEncoderLayer,
    ACTPolicy,
    ACTSinusoidalPositionEmbedding2d,
    ACTTemporalEnsembler,
    create_sinusoidal_pos_embedding,
)

STATE_DIM, ENV_DIM, ACTION_DIM, BATCH = 3, 6, 2, 4


def make_config(with_state: bool = True, **overrides) -> ACTConfig:
    inputs = {"observation.environment_state": {"type": "ENV", "shape": [ENV_DIM]}}
    if with_state:
        inputs["observation.state"] = {"type": "STATE", "shape": [STATE_DIM]}
    return ACTConfig.tiny(
        input_features=inputs,
        output_features={"action": {"type": "ACTION", "shape": [ACTION_DIM]}},
        **overrides,
    )


def make_batch(cfg: ACTConfig, batch_size: int = BATCH, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    is_pad = torch.zeros(batch_size, cfg.chunk_size, dtype=torch.bool)
    is_pad[0, -3:] = True
    return {
        "observation.state": torch.randn(batch_size, STATE_DIM, generator=gen),
        "observation.environment_state": torch.randn(batch_size, ENV_DIM, generator=gen),
        "action": torch.randn(batch_size, cfg.chunk_size, ACTION_DIM, generator=gen),
        "action_is_pad": is_pad,
    }


@pytest.mark.parametrize("use_vae", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
def test_forward_backward(use_vae: bool, with_state: bool) -> None:
    torch.manual_seed(0)
    cfg = make_config(with_state=with_state, use_vae=use_vae)
    policy = ACTPolicy(cfg)
    policy.train()
    loss, loss_dict = policy(make_batch(cfg))
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert set(loss_dict) == ({"l1_loss", "kld_loss"} if use_vae else {"l1_loss"})
    assert all(
        isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad
        for v in loss_dict.values()
    )
    expected = (
        loss_dict["l1_loss"].item()
        + cfg.kl_weight * loss_dict.get("kld_loss", torch.tensor(0.0)).item()
    )
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    no_grad = [n for n, p in policy.named_parameters() if p.grad is None]
    assert no_grad == []
    chunk = policy.predict_action_chunk(make_batch(cfg))
    assert chunk.shape == (BATCH, cfg.chunk_size, ACTION_DIM)
    assert not policy.training


def test_vae_modules_only_with_vae() -> None:
    assert hasattr(ACTPolicy(make_config(use_vae=True)).model, "vae_encoder_cls_embed")
    no_vae = ACTPolicy(make_config(use_vae=False)).model
    assert no_vae.vae_encoder is None
    assert not any(k.startswith("vae_encoder") for k in no_vae.state_dict())


def test_loss_decreases() -> None:
    torch.manual_seed(0)
    cfg = make_config()
    policy = ACTPolicy(cfg)
    policy.train()
    batch = make_batch(cfg)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    losses = []
    for _ in range(50):
        loss, _ = policy(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


def test_padded_actions_do_not_count() -> None:
    cfg = make_config(use_vae=False)
    policy = ACTPolicy(cfg).eval()
    batch = make_batch(cfg)
    changed = dict(batch, action=batch["action"].clone())
    changed["action"][0, -3:] += 100.0
    assert policy(batch)[0].item() == policy(changed)[0].item()


def test_losses_are_batch_means() -> None:
    """Mean of equal-sized per-rank losses == loss of the whole batch (DDP/FSDP parity)."""
    cfg = make_config(dropout=0.0)
    policy = ACTPolicy(cfg).train()
    batch = make_batch(cfg, batch_size=8)
    halves = [{k: v[i : i + 4] for k, v in batch.items()} for i in (0, 4)]
    _, full = policy(batch)
    parts = [policy(half)[1] for half in halves]
    # mu and log sigma^2 do not depend on the latent sample: the KL term is deterministic.
    assert full["kld_loss"].item() == pytest.approx(
        (parts[0]["kld_loss"] + parts[1]["kld_loss"]).item() / 2
    )
    policy.eval()
    l1 = policy(batch)[1]["l1_loss"].item()
    # L1 averages over non-padded values (LeRobot 0.6.1), so parts with different padding
    # only average to the whole batch's loss when divided by the whole batch's count.
    total = policy.loss_normalizers(batch)["l1"]
    assert total == sum(policy.loss_normalizers(h)["l1"] for h in halves)
    l1_parts = [
        policy(half, normalizers={"l1": (total, 2)})[1]["l1_loss"].item() for half in halves
    ]
    own_count = [policy(half)[1]["l1_loss"].item() for half in halves]
    assert l1 != pytest.approx(sum(own_count) / 2, rel=1e-6)
    assert l1 == pytest.approx(sum(l1_parts) / 2, rel=1e-6)


def test_randomness_comes_from_global_rng() -> None:
    cfg = make_config()
    policy = ACTPolicy(cfg).train()
    batch = make_batch(cfg)
    torch.manual_seed(123)
    first = policy(batch)[0]
    second = policy(batch)[0]
    torch.manual_seed(123)
    assert policy(batch)[0].item() == first.item()
    assert second.item() != first.item()


@pytest.mark.parametrize("pre_norm", [False, True])
def test_vae_encoder_computes_the_cls_row_alone_with_the_same_draws(pre_norm: bool) -> None:
    """Only the cls token's output of the VAE encoder is used: its last layer runs the
    feed-forward of that row alone. Same row, same gradients of every parameter and input, and
    the generator where the whole layer leaves it (dropout on: its masks are drawn whole)."""
    torch.manual_seed(0)
    cfg = make_config(pre_norm=pre_norm, dropout=0.3, n_vae_encoder_layers=2)
    encoder = ACTEncoder(cfg, is_vae_encoder=True).train()
    x = torch.randn(7, BATCH, cfg.dim_model, requires_grad=True)
    pos = torch.randn(7, 1, cfg.dim_model)
    pad = torch.zeros(BATCH, 7, dtype=torch.bool)
    pad[0, -2:] = True
    results = []
    for first_row_only in (False, True):
        encoder.zero_grad()
        x.grad = None
        torch.manual_seed(5)
        out = encoder(x, pos, pad, first_row_only=first_row_only)
        row = out[0] if first_row_only else out[:1][0]
        assert out.shape[0] == (1 if first_row_only else 7)
        row.square().sum().backward()
        grads = {n: p.grad.clone() for n, p in encoder.named_parameters()}
        results.append((row.detach(), grads, x.grad.clone(), torch.rand(3)))
    (full, full_grads, full_x, full_next), (first, grads, x_grad, next_draws) = results
    torch.testing.assert_close(first, full, atol=1e-6, rtol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, full_grads[name], atol=1e-5, rtol=0, msg=name)
    torch.testing.assert_close(x_grad, full_x, atol=1e-6, rtol=0)
    assert torch.equal(next_draws, full_next)
    with torch.no_grad():  # eval mode: no dropout, the same row
        encoder.eval()
        torch.testing.assert_close(
            encoder(x, pos, pad, first_row_only=True)[0], encoder(x, pos, pad)[0], atol=1e-6, rtol=0
        )


def test_batch_errors() -> None:
    cfg = make_config()
    policy = ACTPolicy(cfg)
    batch = make_batch(cfg)
    with pytest.raises(ValueError, match="chunk_size, action_dim"):
        policy(dict(batch, action=batch["action"][:, :5]))
    with pytest.raises(KeyError, match="action_is_pad"):
        policy({k: v for k, v in batch.items() if k != "action_is_pad"})


def test_select_action_queue() -> None:
    cfg = make_config(n_action_steps=3)
    policy = ACTPolicy(cfg)
    batch = make_batch(cfg)
    chunk = policy.predict_action_chunk(batch)
    calls = []
    policy.model.register_forward_hook(lambda *_: calls.append(1))
    actions = [policy.select_action(batch) for _ in range(4)]
    assert len(calls) == 2
    for i in range(3):
        torch.testing.assert_close(actions[i], chunk[:, i])
    torch.testing.assert_close(actions[3], chunk[:, 0])
    policy.reset()
    policy.select_action(batch)
    assert len(calls) == 3


def test_temporal_ensembler_matches_weighted_average() -> None:
    coeff, chunk_size = 0.3, 5
    ensembler = ACTTemporalEnsembler(coeff, chunk_size)
    chunks = [torch.randn(2, chunk_size, 3) for _ in range(8)]
    for t, _ in enumerate(chunks):
        action = ensembler.update(chunks[t])
        # Predictions for step t: chunk s (s <= t) predicted it at offset t - s; oldest first.
        preds = [chunks[s][:, t - s] for s in range(max(0, t - chunk_size + 1), t + 1)]
        weights = torch.exp(-coeff * torch.arange(len(preds), dtype=torch.float32))
        expected = sum(w * p for w, p in zip(weights, preds, strict=True)) / weights.sum()
        torch.testing.assert_close(action, expected)


def test_select_action_with_temporal_ensembling() -> None:
    cfg = make_config(n_action_steps=1, temporal_ensemble_coeff=0.01)
    policy = ACTPolicy(cfg)
    batch = make_batch(cfg)
    chunk = policy.predict_action_chunk(batch)
    torch.testing.assert_close(policy.select_action(batch), chunk[:, 0])
    assert policy.select_action(batch).shape == (BATCH, ACTION_DIM)
    policy.reset()
    torch.testing.assert_close(policy.select_action(batch), chunk[:, 0])


def test_module_classes_and_fsdp_wrap_units() -> None:
    policy = ACTPolicy(make_config())
    assert isinstance(policy.model, ACT)
    assert isinstance(policy.model.encoder, ACTEncoder)
    assert isinstance(policy.model.decoder, ACTDecoder)
    present = {type(m).__name__ for m in policy.modules()}
    assert {"ACTEncoderLayer", "ACTDecoderLayer"} <= present
    # The backbone's residual blocks are units too; without cameras there is no backbone.
    assert set(ACTPolicy._fsdp_wrap_modules) - present == {"BasicBlock", "Bottleneck"}
    assert ACTPolicy._fsdp_wrap_modules == [
        ACTEncoderLayer.__name__,
        ACTDecoderLayer.__name__,
        "BasicBlock",
        "Bottleneck",
    ]
    n_layers = sum(isinstance(m, ACTEncoderLayer | ACTDecoderLayer) for m in policy.modules())
    cfg = policy.config
    assert n_layers == cfg.n_encoder_layers + cfg.n_vae_encoder_layers + cfg.n_decoder_layers


def test_no_shared_parameters() -> None:
    policy = ACTPolicy(make_config())
    storages = [p.untyped_storage().data_ptr() for p in policy.parameters()]
    assert len(storages) == len(set(storages))
    all_named = list(policy.named_parameters(remove_duplicate=False))
    assert len(all_named) == len(list(policy.parameters()))


def test_default_size_has_lerobots_parameter_count() -> None:
    """LeRobot's default ACT (a resnet18 backbone, dim_model 512, 4 + 1 layers, a 4-layer VAE
    encoder) over one 6-dim environment state and a 2-dim action."""
    inputs = {"observation.environment_state": {"type": "ENV", "shape": [ENV_DIM]}}
    outputs = {"action": {"type": "ACTION", "shape": [ACTION_DIM]}}
    with torch.device("meta"):
        policy = ACTPolicy(ACTConfig(input_features=inputs, output_features=outputs))
    n_params = sum(p.numel() for p in policy.parameters())
    # LeRobot 0.6.1's count for the same config: its ACTPolicy(ACTConfig(input_features=
    # {"observation.environment_state": PolicyFeature(ENV, (6,))}, output_features={"action":
    # PolicyFeature(ACTION, (2,))})) built on the meta device, run in .venv-lerobot.
    assert n_params == 40_159_938


def test_position_embeddings() -> None:
    table = create_sinusoidal_pos_embedding(7, 8)
    assert table.shape == (7, 8) and table.dtype == torch.float32
    torch.testing.assert_close(table[0, 0::2], torch.zeros(4))
    torch.testing.assert_close(table[0, 1::2], torch.ones(4))
    torch.testing.assert_close(table[3, 0], torch.sin(torch.tensor(3.0)))
    embed = ACTSinusoidalPositionEmbedding2d(16)
    assert isinstance(embed, nn.Module)
    assert embed(torch.zeros(2, 5, 4, 6)).shape == (1, 32, 4, 6)


def test_fsdp2_wrap_units_train_and_save(tmp_path: Path) -> None:
    """One-process gloo group: shard each wrap unit and the root, step, gather, save, reload."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        cfg = make_config(dropout=0.0, use_vae=False)
        torch.manual_seed(0)
        policy = ACTPolicy(cfg)
        reference = ACTPolicy(cfg)
        reference.load_state_dict(policy.state_dict())
        for module in list(policy.modules()):
            if type(module).__name__ in ACTPolicy._fsdp_wrap_modules:
                fully_shard(module)
        fully_shard(policy)
        batch = make_batch(cfg)
        loss, _ = policy(batch)
        loss.backward()
        torch.testing.assert_close(loss, reference(batch)[0])
        with pytest.raises(ValueError, match="sharded DTensor"):
            policy.save_pretrained(tmp_path / "sharded")
        full = get_model_state_dict(
            policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        policy.save_pretrained(tmp_path / "full", state_dict=full)
        loaded = ACTPolicy.from_pretrained(tmp_path / "full")
        for key, value in reference.state_dict().items():
            assert torch.equal(loaded.state_dict()[key], value), key
    finally:
        dist.destroy_process_group()
