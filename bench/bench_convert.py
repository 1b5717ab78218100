"""Benchmark ``lerobot-convert-dcp``: time and peak memory of a DCP → model.safetensors conversion.

    .venv/bin/python bench/bench_convert.py [--size_mb=100] [--repeats=11] [--workdir=DIR] [--check]

1. A real 2-rank FSDP2 run (forked processes, gloo on CPU) builds an ACT-sized stack of
   TransformerEncoderLayer(512, 8, 3200) blocks (~17 MB fp32 each) and saves
   ``get_model_state_dict(model)`` with ``dcp.save`` into ``<step>/pretrained_model/pytorch_model_fsdp_0``.
2. In a fresh process (imports done first): one conversion (``convert_checkpoint(step)``, the
   library path of the CLI) with its peak RSS growth over the post-import baseline
   (``/proc/self/clear_refs`` + ``VmHWM``); then the DCP tensors are loaded and, ``--repeats``
   times, in rotating order: the baseline ``safetensors.torch.save_file`` of those tensors to the
   same disk, the same + fsync, and a full conversion (its output removed first). ``os.sync()``
   runs before every timed operation so that no dirty pages of the previous one are charged to the
   next. Alternating in one process matters here: on this VM a write into newly allocated page
   cache after a few idle seconds is 2-6x slower (save_file too: 0.06-0.17 s instead of 0.026 s),
   so isolated single runs compare nothing.
3. The generic path (``dcp.load`` into tensors + ``save_file``, used for unusual shard layouts) is
   measured the same way in another process, for reference.

Targets: save_file time / conversion time >= 0.7 (medians); peak RSS growth <= 1.3 x the weights.
A plain conversion does not fsync (like save_file); with ``--delete_dcp`` it does, so the
"+ fsync" baseline is printed too.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

DIM, HEADS, FF = 512, 8, 3200
LAYER_MB = (4 * DIM * DIM + 4 * DIM + 2 * DIM * FF + FF + DIM + 4 * DIM) * 4 / 1e6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, n_layers: int, dcp_dir: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size)
    )
    code = 0
    try:
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch import nn
        from torch.distributed.checkpoint.state_dict import get_model_state_dict
        from torch.distributed.fsdp import fully_shard

        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        torch.manual_seed(0)
        model = nn.Module()
        model.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(DIM, HEADS, FF, batch_first=True) for _ in range(n_layers)
        )
        model.action_head = nn.Linear(DIM, 14)
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        dcp.save(get_model_state_dict(model), checkpoint_id=dcp_dir)
        dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()
        code = 1
    os._exit(code)


def make_checkpoint(step: Path, size_mb: float, world_size: int) -> None:
    n_layers = max(1, round(size_mb / LAYER_MB))
    pretrained = step / "pretrained_model"
    pretrained.mkdir(parents=True)
    (pretrained / "config.json").write_text(json.dumps({"type": "bench"}))
    port, ctx = _free_port(), mp.get_context("fork")
    dcp_dir = str(pretrained / "pytorch_model_fsdp_0")
    procs = [
        ctx.Process(target=_rank_main, args=(r, world_size, port, n_layers, dcp_dir))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit("checkpoint creation failed")


def _proc_status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _timed(fn) -> float:
    os.sync()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def child(step: str, repeats: int, generic: bool) -> None:
    """Runs in a fresh interpreter: imports, RSS baseline, conversions; prints one JSON line."""
    import torch  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401
    from safetensors.torch import save_file

    from lerobot_pipe.convert import convert_checkpoint, load_dcp_state_dict
    from lerobot_pipe.convert import dcp_to_safetensors as mod

    if generic:
        mod._direct_layout = lambda *a, **k: None
    out = Path(step) / "pretrained_model" / "model.safetensors"
    out.unlink(missing_ok=True)
    os.sync()
    baseline = _proc_status("VmRSS")
    hwm_reset = True
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    except OSError:
        hwm_reset = False
    convert_checkpoint(step)
    peak = _proc_status("VmHWM")

    state = load_dcp_state_dict(Path(step) / "pretrained_model" / "pytorch_model_fsdp_0")
    target = Path(step).parent / "baseline.safetensors"

    def save():
        save_file(state, str(target), metadata={"format": "pt"})

    def save_fsync():
        save()
        fd = os.open(target, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    ops = {"save": save, "save_fsync": save_fsync, "convert": lambda: convert_checkpoint(step)}
    times: dict[str, list[float]] = {name: [] for name in ops}
    names = list(ops)
    for i in range(repeats):
        for name in names[i % 3 :] + names[: i % 3]:
            target.unlink(missing_ok=True)
            out.unlink(missing_ok=True)
            times[name].append(_timed(ops[name]))
    target.unlink(missing_ok=True)
    print(
        json.dumps(
            {
                "times": times,
                "nbytes": sum(v.numel() * v.element_size() for v in state.values()),
                "ntensors": len(state),
                "rss_growth": peak - baseline,
                "hwm_reset": hwm_reset,
            }
        )
    )


def run_child(script: Path, step: Path, repeats: int, generic: bool) -> dict:
    cmd = [sys.executable, str(script), "--_child", str(step), f"--repeats={repeats}"]
    if generic:
        cmd.append("--_generic")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        raise SystemExit(f"conversion subprocess failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size_mb", type=float, default=100.0)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--workdir", default=None, help="folder on the disk to measure")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_generic", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._child:
        child(args._child, args.repeats, args._generic)
        return 0

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = Path(tempfile.mkdtemp(prefix="bench_convert_", dir=args.workdir))
    try:
        step = work / "checkpoints" / "000001"
        t = time.perf_counter()
        make_checkpoint(step, args.size_mb, args.world_size)
        print(
            f"DCP checkpoint from a {args.world_size}-rank FSDP2 run in {time.perf_counter() - t:.1f} s"
        )

        import torch

        script = Path(__file__).resolve()
        fast = run_child(script, step, args.repeats, generic=False)
        generic = run_child(script, step, max(3, args.repeats // 3), generic=True)
        nbytes = fast["nbytes"]
        print(f"weights: {fast['ntensors']} tensors, {nbytes / 1e6:.1f} MB ({torch.__version__})")

        med = statistics.median
        rows = [
            ("save_file (baseline)", fast["times"]["save"], None),
            ("save_file + fsync", fast["times"]["save_fsync"], None),
            ("convert (direct copy)", fast["times"]["convert"], fast["rss_growth"]),
            ("save_file (generic run)", generic["times"]["save"], None),
            ("convert (generic dcp.load)", generic["times"]["convert"], generic["rss_growth"]),
        ]
        print(f"\n{'':28s} {'median s':>9s} {'min s':>7s} {'peak RSS growth':>16s}")
        for name, times, rss in rows:
            rss_text = f"{rss / 1e6:8.1f} MB ({rss / nbytes:.2f}x)" if rss is not None else ""
            print(f"{name:28s} {med(times):9.3f} {min(times):7.3f} {rss_text:>16s}")
        convert_t = med(fast["times"]["convert"])
        ratio = med(fast["times"]["save"]) / convert_t
        ratio_sync = med(fast["times"]["save_fsync"]) / convert_t
        ratio_generic = med(generic["times"]["save"]) / med(generic["times"]["convert"])
        rss_ratio = fast["rss_growth"] / nbytes
        print(
            f"\nratio save_file / convert            = {ratio:.2f}  (target >= 0.7)"
            f"\nratio (save_file + fsync) / convert  = {ratio_sync:.2f}"
            f"\nratio save_file / generic convert    = {ratio_generic:.2f}"
            f"\npeak RSS growth / weights             = {rss_ratio:.2f}  (target <= 1.3)"
            + ("" if fast["hwm_reset"] else "  [VmHWM could not be reset: includes imports]")
        )
        ok = ratio >= 0.7 and rss_ratio <= 1.3
        print(f"targets: {'PASS' if ok else 'MISS'}")
        return 0 if ok or not args.check else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
