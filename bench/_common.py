"""Shared helpers of the benchmark scripts (not a test module).

Import this FIRST in a benchmark: it pins one intra-op thread per process (the machines have 2
cores, and every process of a multi-rank run gets its own) before torch is imported.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
for _key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
    os.environ.pop(_key, None)  # a single-process benchmark must not look launched

REPO = Path(__file__).resolve().parent.parent
for _p in (REPO, REPO / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import torch  # noqa: E402

from lerobot_pipe.policies.act import ACT_TINY_PRESET  # noqa: E402 - after the thread settings

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# ACT sizes used across the benchmarks. "medium" is the trainer-overhead model: a step of batch 32
# takes ~30-70 ms on one core of these machines.
_ACT_COMMON = dict(chunk_size=10, n_action_steps=10, n_heads=8, n_decoder_layers=1, latent_dim=32)


def _act(dim_model: int, dim_feedforward: int, n_encoder_layers: int, n_vae_encoder_layers: int):
    return dict(
        _ACT_COMMON,
        dim_model=dim_model,
        dim_feedforward=dim_feedforward,
        n_encoder_layers=n_encoder_layers,
        n_vae_encoder_layers=n_vae_encoder_layers,
    )


ACT_SIZES: dict[str, dict] = {
    "small": dict(ACT_TINY_PRESET),  # the tiny preset of the embedded default run
    "medium": _act(128, 512, 2, 1),
    "large": _act(256, 1024, 4, 2),
    # ~26.9 M parameters (~108 MB fp32): the FSDP memory / checkpoint model.
    "100mb": _act(512, 3200, 3, 2),
}

# Local SmolVLM geometries (config only, random weights: nothing is downloaded), written with the
# tests' tiny tokenizer and processor files (tests/smolvla_tiny.py; SmolVLA reads only their
# special token ids). Each: (text config, vision config, the connector's scale factor).
SMOLVLM_GEOMETRIES: dict[str, tuple[dict, dict, int]] = {
    # SmolVLM2-500M-Video-Instruct's (SmolVLA's real size: 450,046,176 parameters at its defaults).
    "smolvlm2-500m": (
        dict(
            hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
            num_key_value_heads=5, head_dim=64, vocab_size=49280,
        ),
        dict(
            hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
            num_attention_heads=12, image_size=512, patch_size=16,
        ),
        4,
    ),
    # "SmolVLA small" of bench_vs_lerobot.py: SmolVLM-256M's text width (576, 9 heads / 3 kv
    # heads of 64) over 4 layers, a 4-layer 384-wide vision tower on 128x128 frames (patch 16,
    # 16 image tokens after the pixel shuffle); a step of batch 8 takes ~1-3 s on a core here.
    "small": (
        dict(
            hidden_size=576, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=9,
            num_key_value_heads=3, head_dim=64,
        ),
        dict(
            hidden_size=384, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=6,
            image_size=128, patch_size=16,
        ),
        2,
    ),
}  # fmt: skip


def write_smolvlm(folder: Path, geometry: str, with_weights: bool = False) -> Path:
    """A local SmolVLM folder (``vlm_model_name``) of one of ``SMOLVLM_GEOMETRIES``; with
    random bf16 weights saved too (``model.safetensors``) with ``with_weights``."""
    from smolvla_tiny import build_tiny_smolvlm

    text, vision, scale = SMOLVLM_GEOMETRIES[geometry]
    return build_tiny_smolvlm(
        folder, text=text, vision=vision, scale_factor=scale, with_weights=with_weights
    )


def policy_flags(size: str | dict) -> dict[str, object]:
    """lerobot-train flags of an ACT size; a camera backbone starts from random weights (no
    ImageNet download in a benchmark)."""
    fields = ACT_SIZES[size] if isinstance(size, str) else size
    return {
        "policy.type": "act",
        "policy.pretrained_backbone_weights": "null",
        **{f"policy.{k}": v for k, v in fields.items()},
    }


def argv_from(flags: dict[str, object]) -> list[str]:
    out = []
    for k, v in flags.items():
        if v is None:
            continue
        if isinstance(v, bool):
            v = str(v).lower()
        out.append(f"--{k}={v}")
    return out


def bench_tmp(name: str) -> Path:
    """A fresh scratch folder (under $BENCH_TMP or the system temp dir), removed when this process
    exits unless BENCH_KEEP=1. Forked ranks (os._exit) never remove it."""
    base = Path(os.environ.get("BENCH_TMP", tempfile.gettempdir()))
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"bench_{name}_", dir=base))
    if os.environ.get("BENCH_KEEP") != "1":
        owner = os.getpid()
        atexit.register(lambda: os.getpid() == owner and shutil.rmtree(path, ignore_errors=True))
    return path


def synthetic_dataset(
    root: Path, num_episodes: int = 50, episode_length: int = 100, camera_size: int = 0
) -> Path:
    """The synthetic reaching dataset; with ``camera_size`` > 0 one ``top`` camera of that size
    (AV1 video, as LeRobot records cameras)."""
    from lerobot_pipe.datasets import write_synthetic_dataset

    cameras = ("top",) if camera_size else ()
    size = camera_size or 64
    return write_synthetic_dataset(
        root,
        num_episodes=num_episodes,
        episode_length=episode_length,
        cameras=cameras,
        image_size=size,
    )


def act_policy_and_data(
    size: str | dict,
    dataset_root: Path,
    batch_size: int,
    seed: int = 0,
    rank: int = 0,
    dp_world_size: int = 1,
):
    """(policy, dataset, sampler, preprocessor) built the way make_plan + train build them."""
    from lerobot_pipe.datasets import GlobalBatchSampler, LeRobotDataset
    from lerobot_pipe.policies.act.configuration_act import ACTConfig
    from lerobot_pipe.policies.factory import make_policy, make_pre_post_processors

    fields = ACT_SIZES[size] if isinstance(size, str) else size
    cfg = ACTConfig(**{"pretrained_backbone_weights": None, **fields})
    ds = LeRobotDataset(
        dataset_root, delta_timestamps={"action": [i / 10 for i in cfg.action_delta_indices]}
    )
    # fps of the synthetic dataset is 10; make_plan reads it from info.json the same way
    assert ds.fps == 10
    torch.manual_seed(seed)
    policy = make_policy(cfg, ds.features)
    policy.train()
    pre, _ = make_pre_post_processors(cfg, dataset_stats=ds.stats)
    sampler = GlobalBatchSampler(len(ds), batch_size, rank, dp_world_size, seed)
    return policy, ds, sampler, pre


def wrap_policy(policy, dims, env) -> torch.nn.Module:
    """``policy`` wrapped for ``dims`` with the default accelerator options, as the trainer wraps
    it (a sharded run with the sharding make_plan would plan)."""
    from lerobot_pipe.configs.train import AcceleratorConfig
    from lerobot_pipe.distributed.parallelize import apply_parallelism, plan_sharding

    accelerator = AcceleratorConfig()
    sharding = None
    if dims.is_sharded:
        sharding = plan_sharding(policy, accelerator, type(policy)._fsdp_wrap_modules)
    return apply_parallelism(policy, dims, env, accelerator, sharding)


def diffusion_policy_and_data(
    dataset_root: Path,
    batch_size: int,
    seed: int = 0,
    rank: int = 0,
    dp_world_size: int = 1,
    **fields,
):
    """(policy, dataset, sampler, preprocessor) of Diffusion Policy at LeRobot's default size
    (random-init resnet18) or with config ``fields`` changed, built the way make_plan + train
    build them: delta timestamps from the policy's windows, the sampler off each episode's last
    drop_n_last_frames frames."""
    from lerobot_pipe.datasets import GlobalBatchSampler, LeRobotDataset
    from lerobot_pipe.policies.diffusion import DiffusionConfig
    from lerobot_pipe.policies.factory import make_policy, make_pre_post_processors
    from lerobot_pipe.training.data import sample_indices

    cfg = DiffusionConfig(**{"pretrained_backbone_weights": None, **fields})
    probe = LeRobotDataset(dataset_root)
    fps = probe.fps
    windows = {
        key: [i / fps for i in cfg.observation_delta_indices]
        for key in probe.features
        if key.startswith("observation.")
    }
    windows["action"] = [i / fps for i in cfg.action_delta_indices]
    ds = LeRobotDataset(dataset_root, delta_timestamps=windows)
    torch.manual_seed(seed)
    policy = make_policy(cfg, ds.features)
    policy.train()
    pre, _ = make_pre_post_processors(cfg, dataset_stats=ds.stats)
    sampler = GlobalBatchSampler(
        len(ds), batch_size, rank, dp_world_size, seed, indices=sample_indices(cfg, ds)
    )
    return policy, ds, sampler, pre


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def median(xs):
    return statistics.median(xs)


def spread(xs) -> str:
    return f"min {min(xs):.3g} / max {max(xs):.3g}"


def malloc_trim() -> None:
    gc.collect()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def rss_bytes() -> int:
    """Current VmRSS of this process, after gc + malloc_trim."""
    return rss_parts()["VmRSS"]


def rss_parts() -> dict[str, int]:
    """VmRSS and its parts (RssAnon: heap etc., RssFile: mapped files such as libtorch's code
    pages, RssShmem) of this process in bytes, after gc + malloc_trim."""
    malloc_trim()
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(line.split()[1]) * 1024
    return out


def reset_peak_rss() -> None:
    """Start VmHWM (this process's peak RSS) again from the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_bytes() -> int:
    """VmHWM: this process's peak RSS since it started or since :func:`reset_peak_rss`."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def machine_load() -> str:
    try:
        return "load average " + " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "load average unknown"


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.s = time.perf_counter() - self.t0


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"
