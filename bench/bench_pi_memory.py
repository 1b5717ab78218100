"""Per-rank memory of pi0 and pi0.5 at their real size (PaliGemma: SigLIP So400m/14 + Gemma 2B,
with the Gemma 300M action expert; 4.03 B / 4.14 B parameters), fp32 full fine-tune with AdamW,
sharded with FSDP2 by the project's own code (issue 38 item 5).

    .venv/bin/python bench/bench_pi_memory.py [--parts fake,real] [--worlds 1,2,4,8] [--batches 1]

Part ``fake`` (the real size, no memory used): each case runs in its own process under torch's
FakeTensorMode with a fake process group of N ranks (``FakeStore`` + ``init_process_group
("fake")``): the policy is built (``PI0Policy`` / ``PI05Policy``, one 224x224 camera, 48 / 200
prompt tokens, chunk 50), its wrap units chosen by ``plan_sharding`` and sharded by ``apply_fsdp``
(lerobot_pipe/distributed/parallelize.py) as the trainer does (N = 1: no sharding, as one process
trains), AdamW built by ``make_optimizer`` from the policy's groups, then one step (forward,
backward, optimizer step) under ``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` (N =
1: ``MemTracker``). Reported per rank: the bytes of the local shards of parameters, gradients and
AdamW state after the step (from the DTensors' local shapes: exact); the tracker's peak over the
forward and backward (all of it: shards, gathered units, gradients, activations, temporaries,
collective buffers) and its parts there; for N > 1 a second forward and backward with the AdamW
state held and the gradients freed (``zero_grad(set_to_none=True)``, as the loop does), the peak of
a later step (N = 1: the first one's plus the AdamW state); and the storages autograd saved for the
backward (``saved_tensors_hooks``, each once, parameters left out), with and without activation
checkpointing (``apply_activation_checkpointing`` on the units, as ``--accelerator.
activation_checkpointing.mode=full``). The optimizer step is torch's per-tensor AdamW loop (the
fake kernel of the fused one allocates new outputs for every state tensor); the tracker's count of
its temporaries on DTensors is not used. Two adaptations, for the tracker only: our decoder layers
run through their unit entry (``run_as_unit``, a registered FSDP forward method that the tracker's
forward hooks never see), so in these processes the entry calls the module (``module(fn, *args)``
with the entry as its forward: the same FSDP pre/post-forward work, through the hooks); and the two
lm_head units, never used, are never gathered, which the tracker's post-backward wrapper does not
expect (it is skipped for them).

Part ``real`` (real processes, forked ranks with gloo, tests/launch.py): the real widths with fewer
layers -- both Gemma stacks at depth 2, 2 SigLIP layers, and the vocabulary cut from 257,152 to
32,768 (ids of the local tokenizer are < 260; the real vocabulary's embedding and lm_heads alone,
1.32 B parameters, would not fit a 24 GB machine with AdamW) -- patched into this process only
(configuration_pi0.GEMMA_VARIANTS / SIGLIP_SO400M, paligemma_expert.VOCAB_SIZE). Each rank runs the
trainer's ``prepare_session`` (on the meta device when sharded) and one step on a batch of the
synthetic camera dataset, and reports its local bytes, its peak RSS growth while building (over the
model's parameter bytes) and through the first step (its optimizer step included), and the saved
bytes. ``*-path`` cases build from ``--policy.path``: a file in the ``pi05_base`` / ``pi0_base``
layout (keys without ``model.``, no embedding key, only ``lm_head``: PiPolicyBase.map_file_keys)
read rank by rank. The same geometry is also run through part ``fake``, and the per-unit figures of
both (one layer of each stack, one SigLIP layer) are compared.

Targets: state per rank <= 1.1/N of one process; no rank holds the whole model (peak RSS growth
while building < the model's parameter bytes).
"""

from __future__ import annotations

import _common as c  # must come first: pins threads, sets sys.path

# isort: split

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

MB = 1024 * 1024
REDUCED_DEPTH = 2
REDUCED_SIGLIP_LAYERS = 2
REDUCED_VOCAB = 32_768
CAMERA = "observation.images.top"
STATE_DIM = ACTION_DIM = 2  # the synthetic dataset's state and action
# Units whose figures are compared between the fake-tensor and the real runs.
UNITS = {
    "siglip layer": "model.paligemma_with_expert.paligemma.model.vision_tower.vision_model."
    "encoder.layers.0",
    "gemma_2b layer": "model.paligemma_with_expert.paligemma.model.language_model.layers.0",
    "gemma_300m layer": "model.paligemma_with_expert.gemma_expert.model.layers.0",
}
EMBED = "model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"


def reduce_geometry() -> None:
    """The real widths with fewer layers and a smaller vocabulary, in this process only."""
    from lerobot_pipe.policies.pi0 import configuration_pi0 as conf
    from lerobot_pipe.policies.pi0 import paligemma_expert

    for name in ("gemma_2b", "gemma_300m"):
        conf.GEMMA_VARIANTS[name] = dataclasses.replace(
            conf.GEMMA_VARIANTS[name], depth=REDUCED_DEPTH
        )
    conf.SIGLIP_SO400M = dataclasses.replace(conf.SIGLIP_SO400M, num_layers=REDUCED_SIGLIP_LAYERS)
    paligemma_expert.VOCAB_SIZE = REDUCED_VOCAB


# --- figures common to both parts ----------------------------------------------------------


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def state_figures(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Local bytes of parameters, gradients and optimizer state, in all and per compared unit
    (with the unit's whole parameter bytes, ``full_b``)."""

    def figures(params: list) -> dict:
        return {
            "params_b": sum(_local(p).nbytes for p in params),
            "grads_b": sum(_local(p.grad).nbytes for p in params if p.grad is not None),
            "optim_b": sum(
                _local(v).nbytes
                for p in params
                for v in optimizer.state.get(p, {}).values()
                if isinstance(v, torch.Tensor) and v.dim() > 0  # not the step counts
            ),
            "full_b": sum(p.numel() * p.element_size() for p in params),
        }

    params = list(model.parameters())
    out = figures(params)
    out["step_counts_b"] = sum(
        _local(v).nbytes
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.dim() == 0
    )
    out["state_b"] = out["params_b"] + out["grads_b"] + out["optim_b"]
    out["global_params"] = sum(p.numel() for p in params)
    out["trainable_params"] = sum(p.numel() for p in params if p.requires_grad)
    named = dict(model.named_modules())
    out["units"] = {
        label: figures(list(named[name].parameters()))
        for label, name in UNITS.items()
        if name in named
    }
    return out


def saved_counter():
    """(storage -> bytes, a pack hook): the storages autograd saves for the backward, each once,
    parameters (and views of them: a linear layer saves its weight) left out."""
    kept: dict[int, int] = {}

    def pack(tensor):
        base = tensor._base if tensor._base is not None else tensor
        if not isinstance(base, torch.nn.Parameter) and not isinstance(tensor, torch.nn.Parameter):
            storage = tensor.untyped_storage()
            kept[storage._cdata] = storage.nbytes()
        return tensor

    return kept, pack


def _features(kind: str) -> dict:
    return dict(
        input_features={
            CAMERA: {"type": "VISUAL", "shape": [3, 224, 224]},
            "observation.state": {"type": "STATE", "shape": [STATE_DIM]},
        },
        output_features={"action": {"type": "ACTION", "shape": [ACTION_DIM]}},
        device="cpu",
    )


def _policy_classes(kind: str):
    from lerobot_pipe.policies.pi0 import PI0Config, PI0Policy
    from lerobot_pipe.policies.pi05 import PI05Config, PI05Policy

    return (PI0Config, PI0Policy) if kind == "pi0" else (PI05Config, PI05Policy)


# --- part fake: one case per process -------------------------------------------------------


class _NoHook:
    def remove(self) -> None:
        pass


def _parts(snapshot: dict) -> dict[str, int]:
    """A tracker snapshot's non-zero parts by name (``Sharded Param``, ``OptState``, ...)."""
    return {getattr(k, "value", str(k)): v for k, v in snapshot.items() if k != "Total" and v}


def fake_case(kind: str, world: int, ac: bool, batch: int, reduced: bool) -> dict:
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from lerobot_pipe.configs.train import AcceleratorConfig
    from lerobot_pipe.distributed import parallelize
    from lerobot_pipe.distributed.activation_checkpointing import (
        apply_activation_checkpointing,
        checkpointed_units,
    )
    from lerobot_pipe.distributed.parallel_dims import ParallelDims
    from lerobot_pipe.distributed.runtime import DistEnv
    from lerobot_pipe.distributed.unit_probe import UNIT_ENTRY, has_unit_entry
    from lerobot_pipe.training.optim import make_optimizer

    if reduced:
        reduce_geometry()

    class Tracker(FSDPMemTracker):
        # Units never gathered (the unused lm_heads) have no unsharded parameters, which the
        # tracker's post-backward wrapper reads: run FSDP's own post-backward for them.
        def _fsdp_param_group_post_backward(self, fsdp_mod, orig):
            tracked = super()._fsdp_param_group_post_backward(fsdp_mod, orig)

            def inner(*args, **kwargs):
                group = fsdp_mod._get_fsdp_state()._fsdp_param_group
                if all(hasattr(p, "_unsharded_param") for p in group.fsdp_params):
                    return tracked(*args, **kwargs)
                return orig(*args, **kwargs)

            return inner

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    env = DistEnv(0, 0, world, torch.device("cpu"), "fake")
    dims = ParallelDims(1, world, world)
    # The mesh is built from real tensors (DeviceMesh reads its rank map), then handed to
    # apply_fsdp.
    mesh = parallelize.build_mesh(dims, env) if world > 1 else None
    parallelize.build_mesh = lambda dims, env: mesh
    config_cls, policy_cls = _policy_classes(kind)
    cfg = config_cls(**_features(kind))
    accelerator = AcceleratorConfig()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        policy = policy_cls(cfg)
        if ac:
            units = None
            if world > 1:
                units = parallelize.plan_sharding(
                    policy, accelerator, policy_cls._fsdp_wrap_modules
                ).wrap_units
            apply_activation_checkpointing(
                policy, checkpointed_units(policy, None, policy_cls._fsdp_wrap_modules, units)
            )
        if world > 1:
            plan = parallelize.plan_sharding(policy, accelerator, policy_cls._fsdp_wrap_modules)
            model = parallelize.apply_fsdp(policy, dims, env, accelerator, plan)
            for module in model.modules():  # the unit entries through the forward hooks
                entry = module.__dict__.get(UNIT_ENTRY)
                if has_unit_entry(module) and hasattr(entry, "__wrapped__"):
                    module.forward = entry.__wrapped__
                    module.__dict__[UNIT_ENTRY] = module.__call__
        else:
            model = policy
        # The per-tensor AdamW loop (LeRobot's default on CPU): the fake kernel of the fused one
        # allocates outputs for every state tensor (the real kernel updates them in place).
        optimizer = make_optimizer(
            policy.get_optim_params(), cfg.get_optimizer_preset(), fused=False
        )
        length = cfg.tokenizer_max_length
        inputs = {
            CAMERA: torch.rand(batch, 3, 224, 224),
            "observation.state": torch.rand(batch, STATE_DIM),
            "action": torch.rand(batch, cfg.chunk_size, ACTION_DIM),
            "observation.language.tokens": torch.randint(0, 257, (batch, length)),
            "observation.language.attention_mask": torch.ones(batch, length, dtype=torch.bool),
        }
        noise = torch.randn(batch, cfg.chunk_size, cfg.max_action_dim)
        time = torch.rand(batch)
        tracker = Tracker(model, optimizer) if world > 1 else MemTracker()
        # The vocab-parallel embedding's rows: a DTensor that no FSDP2 unit manages, made before
        # the tracker starts, which FSDPMemTracker does not count (nor with track_external):
        # added to its peaks below.
        unseen = sum(
            _local(m.weight).nbytes for m in model.modules() if hasattr(m, "_vocab_parallel")
        )
        if world == 1:
            tracker.track_external(model, optimizer)
            for p in model.parameters():  # MemTracker hooks every parameter's gradient
                if not p.requires_grad:
                    tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
        kept, pack = saved_counter()
        with tracker:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
                loss, _ = model(inputs, noise=noise, time=time)
            loss.backward()
            backward_peak = dict(tracker.get_tracker_snapshot("peak")[torch.device("cpu")])
            first_held = _held_most(tracker) if world > 1 else 0
            optimizer.step()
            result = state_figures(model, optimizer)
            later_peak = None
            if world > 1 and not ac:
                # A second step's forward and backward, with the AdamW state now held and the
                # gradients freed as the loop frees them (zero_grad(set_to_none=True)); the
                # tracker's peak restarts from here.
                optimizer.zero_grad(set_to_none=True)
                tracker.reset_mod_stats()
                tracker._peak_mem_snap = tracker.get_tracker_snapshot()
                tracker._peak_mem = {d: v["Total"] for d, v in tracker._peak_mem_snap.items()}
                loss, _ = model(inputs, noise=noise, time=time)
                loss.backward()
                later_peak = dict(tracker.get_tracker_snapshot("peak")[torch.device("cpu")])
    held = _held_most(tracker) if later_peak else first_held + result["optim_b"]
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    result.update(
        kind=kind,
        world=world,
        ac=ac,
        batch=batch,
        reduced=reduced,
        kept_b=sum(kept.values()),
        peak_b=peak["Total"] + unseen,
        peak_parts=_parts(peak),
        backward_peak_b=backward_peak["Total"] + unseen,
        backward_peak_parts=_parts(backward_peak),
        untracked_rows_b=unseen,
        # One process: the first step's forward and backward peak plus the AdamW state (no
        # gathers or collective buffers: a later step differs by that state alone).
        later_peak_b=later_peak["Total"] + unseen
        if later_peak
        else backward_peak["Total"] + unseen + result["optim_b"],
        later_peak_parts=_parts(later_peak) if later_peak else {},
        # N > 1: the most parameters + gradients + optimizer state (with gathered units and
        # collective buffers) over the tracker's snapshots around every unit's forward and
        # backward; N = 1: the state
        held_most_b=held + unseen if world > 1 else result["state_b"],
    )
    dist.destroy_process_group()
    return result


def _held_most(tracker) -> int:
    """The largest parameters + gradients + optimizer state (everything but activations and
    autograd's temporaries) in the FSDP tracker's snapshots: before and after each unit's
    pre/post-forward and pre/post-backward since its module stats were last reset."""
    most = 0
    for stats in tracker.memory_tracking.values():
        for snapshots in getattr(stats, "snapshots", {}).values():
            for snapshot in snapshots:
                parts = _parts(snapshot.get(torch.device("cpu"), {}))
                total = snapshot.get(torch.device("cpu"), {}).get("Total", 0)
                most = max(most, total - parts.get("Activation", 0) - parts.get("Temp", 0))
    return most


def run_fake(kind: str, world: int, ac: bool, batch: int, reduced: bool = False) -> dict:
    """``fake_case`` in a fresh process (one fake process group and one geometry each)."""
    spec = f"{kind}:{world}:{int(ac)}:{batch}:{int(reduced)}"
    proc = subprocess.run(
        ["nice", "-n", "19", sys.executable, __file__, "--fake-case", spec],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise RuntimeError(f"fake case {spec} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- part real: forked ranks with gloo -----------------------------------------------------


def rank_main(argv: list[str]) -> dict:
    c.malloc_trim()
    c.reset_peak_rss()
    start = c.rss_parts()["VmRSS"]
    from lerobot_pipe.datasets import BatchPrefetcher, GlobalBatchSampler
    from lerobot_pipe.distributed.runtime import destroy, init_distributed
    from lerobot_pipe.training.preflight import make_plan
    from lerobot_pipe.training.session import prepare_session

    world = int(os.environ.get("WORLD_SIZE", "1"))
    plan = make_plan(argv, world, os.environ)
    env = init_distributed()
    try:
        session = prepare_session(plan, env)
        built_peak = c.peak_rss_bytes() - start
        cfg = plan.cfg
        sampler = GlobalBatchSampler(
            len(plan.dataset),
            cfg.batch_size,
            dp_rank=env.rank,
            dp_world_size=plan.dims.dp_world_size,
            seed=cfg.seed,
        )
        with BatchPrefetcher(plan.dataset, sampler, 0, device=env.device) as loader:
            batch = session.pre(loader.next())
        kept, pack = saved_counter()
        with c.Timer() as t:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
                loss, _ = session.model(batch)
            loss.backward()
            session.optimizer.step()
            step_peak = c.peak_rss_bytes() - start
        result = state_figures(session.trainee, session.optimizer)
        result.update(
            rank=env.rank,
            built_peak_b=built_peak,
            step_peak_b=step_peak,
            kept_b=sum(kept.values()),
            step_s=t.s,
            loss=float(loss.detach()),
            meta=session.built_on_meta,
        )
        return result
    finally:
        destroy()


def write_base(kind: str, folder: Path, root: Path) -> Path:
    """A reduced-geometry policy saved in the ``pi0_base`` / ``pi05_base`` layout: keys without
    the ``model.`` prefix, the embedding only as ``lm_head``."""
    from safetensors.torch import load_file, save_file

    from lerobot_pipe.datasets import LeRobotDataset
    from lerobot_pipe.policies.factory import fill_features

    config_cls, policy_cls = _policy_classes(kind)
    cfg = config_cls(device="cpu")
    fill_features(cfg, LeRobotDataset(root).features)
    torch.manual_seed(0)
    policy_cls(cfg).save_pretrained(folder)
    del cfg
    saved = load_file(folder / "model.safetensors")
    hub = {k.removeprefix("model."): v for k, v in saved.items() if k != EMBED}
    save_file(hub, folder / "model.safetensors", metadata={"format": "pt"})
    del saved, hub
    c.malloc_trim()
    return folder


# --- the report ------------------------------------------------------------------------------


def _mib(b: float) -> str:
    return f"{b / MB:.0f}"


def step_peak(r: dict) -> int:
    """The peak of a step per rank: a later step's forward and backward (the AdamW state held,
    its gradients built again), or the state after the step if higher (the trainer's fused
    AdamW updates in place; the tracker's count of the per-tensor loop's temporaries on
    DTensors is not used)."""
    return max(r["later_peak_b"], r["state_b"])


def held_at_peak(r: dict) -> int:
    """The parameters (sharded, gathered, all-gather buffers), gradients (sharded, unsharded,
    reduce-scatter buffers) and optimizer state a rank holds at its step's peak: the peak less
    its activations and autograd's temporaries. One process: its state."""
    if r["world"] == 1:
        return r["state_b"]
    if r["later_peak_parts"]:
        parts, total = r["later_peak_parts"], r["later_peak_b"]
    else:  # the first step's peak plus the AdamW state (the rows marked *)
        parts, total = r["backward_peak_parts"], r["backward_peak_b"] + r["optim_b"]
    return total - parts.get("Activation", 0) - parts.get("Temp", 0)


def report_fake(results: list[dict]) -> None:
    print(
        "\nreal size, fake tensors (MiB per rank): kind N batch AC | params grads AdamW state "
        "ratio target | first fwd+bwd peak ratio | step peak ratio | held at the peak (state, "
        "gathered, buffers) ratio verdict | held at most ratio verdict | saved for backward"
    )
    for r in results:
        ref = next(
            (
                x
                for x in results
                if (x["kind"], x["world"], x["batch"], x["ac"], x["reduced"])
                == (r["kind"], 1, r["batch"], False, r["reduced"])
            ),
            None,
        )
        nan = float("nan")
        ratio = r["state_b"] / ref["state_b"] if ref else nan
        bwd_ratio = r["backward_peak_b"] / ref["backward_peak_b"] if ref else nan
        peak_ratio = step_peak(r) / step_peak(ref) if ref else nan
        target = 1.1 / r["world"]
        ok = c.verdict(ratio <= target) if r["world"] > 1 and ref else "-"
        held_ratio = held_at_peak(r) / held_at_peak(ref) if ref else nan
        held_ok = c.verdict(held_ratio <= target) if r["world"] > 1 and ref else "-"
        most_ratio = r["held_most_b"] / ref["state_b"] if ref else nan
        most_ok = c.verdict(most_ratio <= target) if r["world"] > 1 and ref else "-"
        print(
            f"  {r['kind']:5s} {r['world']} {r['batch']} {'AC' if r['ac'] else '--'} | "
            f"{_mib(r['params_b'])} {_mib(r['grads_b'])} {_mib(r['optim_b'])} "
            f"{_mib(r['state_b'])} {ratio:.3f} {target:.3f} {ok} | "
            f"{_mib(r['backward_peak_b'])} {bwd_ratio:.3f} | {_mib(step_peak(r))} "
            f"{peak_ratio:.3f} | {_mib(held_at_peak(r))} {held_ratio:.3f} {held_ok} | "
            f"{_mib(r['held_most_b'])} {most_ratio:.3f} {most_ok} | "
            f"{_mib(r['kept_b'])}",
            flush=True,
        )
        rows = r.get("untracked_rows_b")
        more = f", the vocab-parallel embedding's rows {_mib(rows)}" if rows else ""
        parts = ", ".join(f"{k} {_mib(v)}" for k, v in r["backward_peak_parts"].items())
        print(f"      at the first fwd+bwd peak: {parts}{more}")
        if r["later_peak_parts"]:
            parts = ", ".join(f"{k} {_mib(v)}" for k, v in r["later_peak_parts"].items())
            print(f"      at the second step's fwd+bwd peak: {parts}{more}")


def compare_units(fake: dict, real: dict, label: str, what: str) -> None:
    """Per-unit local bytes (params, grads, AdamW) of a fake-tensor run and a real one."""
    print(f"  {label} vs {what}:")
    for unit, f in fake["units"].items():
        r = real["units"][unit]
        cells = []
        for key in ("params_b", "grads_b", "optim_b", "full_b"):
            ratio = r[key] / f[key] if f[key] else float("nan")
            cells.append(f"{key[:-2]} {_mib(f[key])} / {_mib(r[key])} ({ratio:.4f})")
        print(f"    {unit}: fake / real MiB: " + ", ".join(cells))
    if fake["reduced"]:
        ratio = real["state_b"] / fake["state_b"]
        print(
            f"    whole state per rank: fake {_mib(fake['state_b'])} / real "
            f"{_mib(real['state_b'])} MiB ({ratio:.4f}); the first step's peak (optimizer step "
            f"included): fake {_mib(max(fake['backward_peak_b'], fake['state_b']))} MiB "
            f"(tensors), real {_mib(real['step_peak_b'])} MiB (peak RSS growth)"
        )


REAL_CASES = {  # name -> (world size, extra flags)
    "single": (1, []),
    "fsdp2": (2, ["--parallelism.dp_shard=2"]),
    "fsdp2-path": (2, ["--parallelism.dp_shard=2"]),
}


def run_real(args, kinds: list[str], tmp: Path, full_size: list[dict]) -> tuple[dict, dict]:
    from launch import run_distributed
    from pi_tiny import build_paligemma_tokenizer

    from lerobot_pipe.datasets import write_synthetic_dataset

    hf_home = tmp / "hf"
    build_paligemma_tokenizer(hf_home)
    hub_env = {"HF_HUB_CACHE": str(hf_home / "hub"), "HF_HUB_OFFLINE": "1"}
    os.environ.update(hub_env)  # the forked ranks inherit it
    # huggingface_hub reads the variables once, at import (already done): its constants too.
    from huggingface_hub import constants

    constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = hub_env["HF_HUB_CACHE"], True
    reduce_geometry()
    root = write_synthetic_dataset(
        tmp / "ds", num_episodes=2, episode_length=60, cameras=["top"], image_size=64,
        pixels_only=True,
    )  # fmt: skip
    common = [
        f"--dataset.root={root}",
        "--batch_size=1",
        "--steps=1",
        "--num_workers=0",
        "--save_checkpoint=false",
        "--policy.device=cpu",
    ]
    real, reduced_fake = {}, {}
    print(
        f"\nreal processes at the real widths, Gemma depth {REDUCED_DEPTH}, "
        f"{REDUCED_SIGLIP_LAYERS} SigLIP layers, vocabulary {REDUCED_VOCAB:,} (MiB per rank, "
        "the largest rank):",
        flush=True,
    )
    for kind in kinds:
        base = None
        for case in args.real_cases.split(","):
            world, flags = REAL_CASES[case]
            model = [f"--policy.type={kind}"]
            if case.endswith("-path"):
                if base is None:
                    base = write_base(kind, tmp / f"{kind}_base", root)
                model = [f"--policy.path={base}"]
            argv = [*common, *model, *flags, f"--output_dir={tmp / kind / case}"]
            with c.Timer() as t:
                ranks = run_distributed(rank_main, world, argv, env=hub_env, timeout=args.timeout)
            worst = max(ranks, key=lambda r: r["state_b"])
            worst["built_peak_b"] = max(r["built_peak_b"] for r in ranks)
            worst["step_peak_b"] = max(r["step_peak_b"] for r in ranks)
            real[f"{kind} {case}"] = worst
            print(
                f"{kind} {case}: {t.s:.0f} s; parameters {worst['global_params']:,} (trainable "
                f"{worst['trainable_params']:,}, {_mib(worst['full_b'])} MiB); params "
                f"{_mib(worst['params_b'])}, grads {_mib(worst['grads_b'])}, AdamW "
                f"{_mib(worst['optim_b'])}, state {_mib(worst['state_b'])}; peak RSS growth built "
                f"{_mib(worst['built_peak_b'])} ({worst['built_peak_b'] / worst['full_b']:.2f} "
                f"of the model's bytes), through the step {_mib(worst['step_peak_b'])}; saved for "
                f"backward {_mib(worst['kept_b'])}; step {worst['step_s']:.1f} s"
                f"{'; built on the meta device' if worst['meta'] else ''}",
                flush=True,
            )
        for world in sorted({REAL_CASES[case][0] for case in args.real_cases.split(",")}):
            reduced_fake[f"{kind} {world}"] = run_fake(kind, world, False, 1, reduced=True)
    print("\nstate per rank vs one process (target <= 1.1/N):")
    for name, r in real.items():
        kind, case = name.split()
        world = REAL_CASES[case][0]
        if world > 1 and f"{kind} single" in real:
            ratio = r["state_b"] / real[f"{kind} single"]["state_b"]
            print(
                f"  {name}: {ratio:.3f} (target {1.1 / world:.3f}) {c.verdict(ratio <= 1.1 / world)}"
            )
    print("peak RSS growth per rank while building / the model's parameter bytes (target < 1):")
    for name, r in real.items():
        if REAL_CASES[name.split()[1]][0] > 1:
            ratio = r["built_peak_b"] / r["full_b"]
            print(f"  {name}: {ratio:.2f} {c.verdict(ratio < 1)}")
    print("per-unit figures, fake tensors vs real processes at the same reduced geometry:")
    for name, r in real.items():
        kind, case = name.split()
        world = REAL_CASES[case][0]
        for f in full_size:
            if (f["kind"], f["world"], f["batch"], f["ac"]) == (kind, world, 1, False):
                compare_units(f, r, name, "the real size (fake tensors)")
        fake = reduced_fake.get(f"{kind} {world}")
        if fake is not None:
            compare_units(fake, r, name, "the same reduced geometry (fake tensors)")
    return real, reduced_fake


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fake-case", help=argparse.SUPPRESS)
    ap.add_argument("--parts", default="fake,real")
    ap.add_argument("--kinds", default="pi0,pi05")
    ap.add_argument("--worlds", default="1,2,4,8", help="fake part: world sizes")
    ap.add_argument(
        "--ac-worlds",
        default="2",
        help="fake part: world sizes also run with activation checkpointing",
    )
    ap.add_argument("--batches", default="1", help="fake part: per-rank batches")
    ap.add_argument(
        "--real-cases", default="single,fsdp2,fsdp2-path", help="real part: cases, per kind"
    )
    ap.add_argument("--timeout", type=float, default=1500, help="seconds per real case")
    args = ap.parse_args()
    if args.fake_case:
        kind, world, ac, batch, reduced = args.fake_case.split(":")
        result = fake_case(kind, int(world), bool(int(ac)), int(batch), bool(int(reduced)))
        print(json.dumps(result))
        return
    parts, kinds = args.parts.split(","), args.kinds.split(",")
    args.ac_worlds = [int(w) for w in args.ac_worlds.split(",") if w]
    tmp = c.bench_tmp("pi_memory")
    print(f"pi0 / pi0.5 memory; {c.machine_load()}", flush=True)
    fake = []
    if "fake" in parts:
        for kind in kinds:
            for batch in map(int, args.batches.split(",")):
                for ac in (False, True):
                    for world in map(int, args.worlds.split(",")):
                        if ac and world not in args.ac_worlds:
                            continue
                        with c.Timer() as t:
                            r = run_fake(kind, world, ac, batch)
                        fake.append(r)
                        print(
                            f"fake {kind} N={world} batch {batch} AC {ac}: {t.s:.0f} s; "
                            f"parameters {r['global_params']:,} (trainable "
                            f"{r['trainable_params']:,}); state {_mib(r['state_b'])} MiB, "
                            f"peak {_mib(r['peak_b'])} MiB",
                            flush=True,
                        )
        report_fake(fake)
    real: dict = {}
    reduced_fake: dict = {}
    if "real" in parts:
        real, reduced_fake = run_real(args, kinds, tmp, fake)
    out = {"fake": fake, "real": real, "reduced_fake": reduced_fake}
    (tmp / "results.json").write_text(json.dumps(out, indent=1))
    print(f"(raw figures: {tmp / 'results.json'})")


if __name__ == "__main__":
    main()
