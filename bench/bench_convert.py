"""Benchmark ``lerobot-convert-dcp``: time and peak memory of a DCP → model.safetensors conversion.

    .venv/bin/python bench/bench_convert.py [--size_mb=100] [--repeats=5] [--workdir=DIR] [--check]

1. A real 2-rank FSDP2 run (forked processes, gloo on CPU) builds an ACT-sized stack of
   TransformerEncoderLayer(512, 8, 3200) blocks (~17 MB fp32 each) and saves
   ``get_model_state_dict(model)`` with ``dcp.save`` into ``<step>/pretrained_model/pytorch_model_fsdp_0``.
2. Baseline: ``safetensors.torch.save_file`` of the same tensors (already in memory) to the same disk.
3. Conversion: ``convert_checkpoint(step)`` in a fresh subprocess (imports done first), timed over
   ``--repeats`` runs (the output is removed between runs, so each is a full conversion), with the
   peak RSS growth over the post-import baseline (``/proc/self/clear_refs`` + ``VmHWM``) of the
   first run. The generic path (``dcp.load`` into tensors + ``save_file``) is measured the same way.

Targets: save_file time / conversion time >= 0.7; peak RSS growth <= 1.3 x the weights' size.
``os.sync()`` runs before every timed operation so that dirty pages of the previous one are not
charged to the next. The conversion fsyncs its output (durability), the plain save_file does not:
both ratios (against save_file and against save_file + fsync) are printed.
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


def child(step: str, repeats: int, generic: bool) -> None:
    """Runs in a fresh interpreter: imports, RSS baseline, conversions; prints one JSON line."""
    import torch  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401
    from safetensors.torch import save_file  # noqa: F401

    from lerobot_pipe.convert import convert_checkpoint
    from lerobot_pipe.convert import dcp_to_safetensors as mod

    if generic:
        mod._plan_direct = lambda *a, **k: None
    out = Path(step) / "pretrained_model" / "model.safetensors"
    out.unlink(missing_ok=True)
    os.sync()
    baseline = _proc_status("VmRSS")
    hwm_reset = True
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    except OSError:
        hwm_reset = False
    times = []
    for i in range(repeats):
        out.unlink(missing_ok=True)
        os.sync()
        t = time.perf_counter()
        convert_checkpoint(step)
        times.append(time.perf_counter() - t)
        if i == 0:
            peak = _proc_status("VmHWM")
    print(json.dumps({"times": times, "rss_growth": peak - baseline, "hwm_reset": hwm_reset}))


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
    parser.add_argument("--repeats", type=int, default=5)
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
        from safetensors.torch import save_file

        from lerobot_pipe.convert import load_dcp_state_dict

        state = load_dcp_state_dict(step / "pretrained_model" / "pytorch_model_fsdp_0")
        nbytes = sum(v.numel() * v.element_size() for v in state.values())
        print(f"weights: {len(state)} tensors, {nbytes / 1e6:.1f} MB ({torch.__version__})")

        base_times, sync_times = [], []
        target = work / "baseline.safetensors"
        for _ in range(args.repeats):
            target.unlink(missing_ok=True)
            os.sync()
            t = time.perf_counter()
            save_file(state, str(target), metadata={"format": "pt"})
            base_times.append(time.perf_counter() - t)
            fd = os.open(target, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            sync_times.append(time.perf_counter() - t)
        del state
        target.unlink(missing_ok=True)

        script = Path(__file__).resolve()
        fast = run_child(script, step, args.repeats, generic=False)
        generic = run_child(script, step, args.repeats, generic=True)
        shutil.rmtree(step / "pretrained_model" / "pytorch_model_fsdp_0")

        med = statistics.median
        save_t, save_sync_t = med(base_times), med(sync_times)
        rows = [
            ("save_file (baseline)", base_times, None),
            ("save_file + fsync", sync_times, None),
            ("convert (direct copy)", fast["times"], fast["rss_growth"]),
            ("convert (generic dcp.load)", generic["times"], generic["rss_growth"]),
        ]
        print(f"\n{'':28s} {'median s':>9s} {'min s':>7s} {'peak RSS growth':>16s}")
        for name, times, rss in rows:
            rss_text = f"{rss / 1e6:8.1f} MB ({rss / nbytes:.2f}x)" if rss is not None else ""
            print(f"{name:28s} {med(times):9.3f} {min(times):7.3f} {rss_text:>16s}")
        ratio = save_t / med(fast["times"])
        ratio_sync = save_sync_t / med(fast["times"])
        ratio_generic = save_t / med(generic["times"])
        rss_ratio = fast["rss_growth"] / nbytes
        print(
            f"\nratio save_file / convert            = {ratio:.2f}  (target >= 0.7)"
            f"\nratio (save_file + fsync) / convert  = {ratio_sync:.2f}"
            f"\nratio save_file / generic convert    = {ratio_generic:.2f}"
            f"\npeak RSS growth / weights             = {rss_ratio:.2f}  (target <= 1.3)"
            + ("" if fast["hwm_reset"] else "  [VmHWM could not be reset: includes imports]")
        )
        ok = ratio >= 0.7 and rss_ratio <= 1.3
        fair = ratio_sync >= 0.7 and rss_ratio <= 1.3
        print(
            f"targets vs plain save_file: {'PASS' if ok else 'MISS'}; "
            f"vs save_file + fsync (same durability as the converter): {'PASS' if fair else 'MISS'}"
        )
        return 0 if ok or not args.check else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
