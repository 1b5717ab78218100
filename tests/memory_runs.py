"""What a real training run holds per rank, for the memory planner's tests: each rank builds the
session lerobot-train builds (prepare_session), runs one forward and backward and one optimizer
step, and counts the bytes of the tensors it holds (each storage once): parameters, gradients,
optimizer state, EMA shadow. Several configurations share one process group."""

from __future__ import annotations


def _storage_bytes(tensors) -> tuple[int, int]:
    """(bytes of the distinct storages, bytes of the tensors themselves) of local tensors."""
    seen, storage, local = set(), 0, 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        local += t.nbytes
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            storage += t.untyped_storage().nbytes()
    return storage, local


def _batch(session):
    import torch

    from lerobot_pipe.datasets import BatchPrefetcher
    from lerobot_pipe.training.data import make_sampler

    plan = session.plan
    sampler = make_sampler(plan, plan.cfg.batch_size, 0, 1)
    with BatchPrefetcher(plan.dataset, sampler, 0, device=torch.device("cpu")) as loader:
        return session.pre(loader.next())


def measure_state(argv: list[str]) -> dict:
    """One configuration on this rank: its state bytes (see the module docstring)."""
    import os

    import torch

    from lerobot_pipe.distributed.runtime import DistEnv
    from lerobot_pipe.training.preflight import make_plan
    from lerobot_pipe.training.session import prepare_session

    env: DistEnv = measure_state.env
    plan = make_plan(argv, int(os.environ.get("WORLD_SIZE", "1")), os.environ)
    session = prepare_session(plan, env)
    trainee = session.trainee
    params = list(trainee.parameters())
    out = {"parameters": _storage_bytes(params)}
    loss, _ = session.model(_batch(session))
    loss.backward()
    grads = [p.grad for p in params if p.grad is not None]
    out["gradients"] = _storage_bytes(grads)
    session.optimizer.step()
    state = [t for s in session.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    out["optimizer"] = _storage_bytes(state)
    ema = session.state.ema
    out["ema"] = _storage_bytes(ema.shadow.values()) if ema is not None else (0, 0)
    session.checkpoints.shutdown()
    return out


def measure_all(configs: dict[str, list[str]]) -> dict[str, dict]:
    """Every configuration on this rank, in one process group."""
    from lerobot_pipe.distributed.runtime import destroy, init_distributed

    measure_state.env = init_distributed()
    try:
        return {name: measure_state(argv) for name, argv in configs.items()}
    finally:
        destroy()


class LiveStorages:
    """Bytes of the storages the ops run inside it create and that are still alive: each op's
    outputs seen through a dispatch mode, a storage counted once from its creation until it is
    freed (a weak reference's finalizer); ``peak``: the largest sum at any moment. Storages that
    existed before (parameters, buffers, the batch) are left out. Another instrument than the
    planner's saved-tensor hooks: it sees memory, not autograd's bookkeeping."""

    def __init__(self, existing=()):
        import weakref

        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        self.live: dict[int, int] = {}
        self.bytes = self.peak = 0
        skip = {t.untyped_storage().data_ptr() for t in existing}
        live, tracker = self.live, self

        def release(key):
            tracker.bytes -= live.pop(key, 0)

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                        continue
                    storage = t.untyped_storage()
                    key = storage.data_ptr()
                    if key and key not in skip and key not in live:
                        live[key] = storage.nbytes()
                        tracker.bytes += live[key]
                        tracker.peak = max(tracker.peak, tracker.bytes)
                        weakref.finalize(storage, release, key)
                return out

        self.mode = Mode()


def saved_by_a_real_forward(plan, batch_size: int) -> int:
    """The bytes a real training forward of ``plan``'s policy (built on the CPU) leaves alive
    at ``batch_size``: what it saved for the backward, and its loss."""
    import torch

    from lerobot_pipe.datasets import BatchPrefetcher
    from lerobot_pipe.policies.factory import make_policy
    from lerobot_pipe.policies.peft import apply_peft
    from lerobot_pipe.training.data import make_processors, make_sampler

    cfg = plan.cfg
    torch.manual_seed(0)
    policy = make_policy(cfg.policy, plan.dataset.features, pretrained_parts=False)
    trainee = apply_peft(policy, cfg.peft, cfg.policy.pretrained_path) if cfg.peft else policy
    trainee.train()
    pre, _ = make_processors(plan, "cpu")
    sampler = make_sampler(plan, batch_size, 0, 1)
    with BatchPrefetcher(plan.dataset, sampler, 0, device=torch.device("cpu")) as loader:
        batch = pre(loader.next())
    existing = [*trainee.parameters(), *trainee.buffers()]
    existing += [v for v in batch.values() if isinstance(v, torch.Tensor)]
    tracker = LiveStorages(existing)
    with tracker.mode:
        out = trainee(batch)  # noqa: F841 - its graph holds what was saved
    return tracker.bytes


def peak_of_a_cpu_run(argv: list[str]) -> int:
    """The most bytes of storages alive at once over a real run of ``argv`` (lerobot-train's
    library path, on the CPU: one process, or this rank of run_distributed's): everything it
    creates, counted from creation to release, as a caching allocator would be asked for them
    (bench/gpu_memory_check.py's rehearsal of its GPU comparison, the planner's whole-step
    test)."""
    import gc
    import os

    from lerobot_pipe.training.preflight import make_plan
    from lerobot_pipe.training.train import train

    gc.collect()
    tracker = LiveStorages()
    with tracker.mode:
        train(make_plan(argv, int(os.environ.get("WORLD_SIZE", "1")), os.environ))
    return tracker.peak


def tiny_smolvla_flags(tmp, num_episodes: int) -> list[str]:
    """A tiny SmolVLM (smolvla_tiny) over a 32-pixel one-camera dataset of two tasks."""
    from smolvla_tiny import build_tiny_smolvlm

    from lerobot_pipe.datasets import write_synthetic_dataset
    from lerobot_pipe.policies.smolvla import SMOLVLA_TINY_PRESET

    root = write_synthetic_dataset(
        tmp / "ds32", num_episodes=num_episodes, episode_length=10, cameras=["top"],
        image_size=32, pixels_only=True, num_tasks=2,
    )  # fmt: skip
    flags = {
        "policy.type": "smolvla",
        "policy.vlm_model_name": str(build_tiny_smolvlm(tmp / "vlm")),
        **{f"policy.{k}": v for k, v in SMOLVLA_TINY_PRESET.items()},
        "policy.resize_imgs_with_padding": "[32,32]",
        "dataset.root": str(root),
    }
    return [f"--{k}={v}" for k, v in flags.items()]
