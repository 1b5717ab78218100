"""Benchmark ``lerobot-convert-dcp``: time against ``save_file`` and peak memory, at two sizes.

    .venv/bin/python bench/bench_convert.py [--sizes_mb=100,1024] [--repeats=7,5] [--workdir=DIR]
                                            [--check]

For each size (default ~100 MB and ~1 GB, both as 2 shards):

1. A real 2-rank FSDP2 run (forked processes, gloo on CPU) builds a stack of
   TransformerEncoderLayer(512, 8, 3200) blocks (~17 MB fp32 each) and saves
   ``get_model_state_dict(model)`` with ``dcp.save`` into ``<step>/pretrained_model/pytorch_model_fsdp_0``;
   ``training_state/training_step.json`` then lists every file's size and SHA-256, as the trainer
   writes it (the converter checks the shards against it).
2. Peak RSS growth, each in a fresh process, over the RSS after the imports
   (``/proc/self/clear_refs`` + ``VmHWM``): one plain conversion (``convert_checkpoint(step)``, the
   library path of the CLI), and at the end one with ``delete_dcp=True`` (which also reads the
   file back and compares it tensor by tensor, fsyncs and deletes the shards).
3. Time, in one more process: the DCP tensors are loaded once; then ``--repeats`` rounds, in
   rotating order, of the baseline ``safetensors.torch.save_file`` of those tensors to the same
   disk, a full plain conversion (its output removed first), and two of its parts: the manifest
   check alone and the check + ``dcp.load``. ``os.sync()`` runs before every timed operation so
   that no dirty pages of the previous one are charged to the next. Alternating in one process
   matters on this VM: a write into newly allocated page cache after a few idle seconds is several
   times slower, so isolated single runs compare nothing.

Target: peak RSS growth <= 1.3 x the weights (both kinds of conversion, both sizes). The time
ratio save_file / conversion (medians) is reported, without a target.
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
RSS_TARGET = 1.3


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
        model.layers = nn.ModuleList()
        for _ in range(n_layers):  # shard each block as it is built: peak ~ one block + shards
            layer = nn.TransformerEncoderLayer(DIM, HEADS, FF, batch_first=True)
            fully_shard(layer)
            model.layers.append(layer)
        model.action_head = nn.Linear(DIM, 14)
        fully_shard(model)
        dcp.save(get_model_state_dict(model), checkpoint_id=dcp_dir)
        dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()
        code = 1
    os._exit(code)


def make_checkpoint(step: Path, size_mb: float, world_size: int) -> None:
    from lerobot_pipe import constants as C

    n_layers = max(1, round(size_mb / LAYER_MB))
    pretrained = step / C.PRETRAINED_MODEL_DIR
    pretrained.mkdir(parents=True)
    (pretrained / C.CONFIG_NAME).write_text(json.dumps({"type": "bench"}))
    port, ctx = _free_port(), mp.get_context("fork")
    dcp_dir = str(pretrained / C.MODEL_DCP_DIR)
    procs = [
        ctx.Process(target=_rank_main, args=(r, world_size, port, n_layers, dcp_dir))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(900)
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit("checkpoint creation failed")
    from lerobot_pipe.checkpoint.manifest import file_manifest
    from lerobot_pipe.fsutil import write_json_atomic

    (step / C.TRAINING_STATE_DIR).mkdir()
    info = {"step": 1, "files": file_manifest(step)}
    write_json_atomic(step / C.TRAINING_STATE_DIR / C.TRAINING_STEP, info)


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


def child_rss(step: str, delete_dcp: bool) -> dict:
    """Peak RSS growth of one conversion over the post-import baseline."""
    import torch  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401

    from lerobot_pipe.convert import convert_checkpoint

    os.sync()
    baseline = _proc_status("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        hwm_reset = True
    except OSError:
        hwm_reset = False
    t = time.perf_counter()
    convert_checkpoint(step, delete_dcp=delete_dcp)
    seconds = time.perf_counter() - t
    return {"rss_growth": _proc_status("VmHWM") - baseline, "hwm_reset": hwm_reset, "s": seconds}


def child_times(step: str, repeats: int) -> dict:
    """Times of save_file, a full plain conversion and two of its parts, alternating."""
    from safetensors.torch import save_file

    from lerobot_pipe import constants as C
    from lerobot_pipe.convert import convert_checkpoint, load_dcp_state_dict, verify_dcp_files

    dcp_dir = Path(step) / C.PRETRAINED_MODEL_DIR / C.MODEL_DCP_DIR
    out = Path(step) / C.PRETRAINED_MODEL_DIR / C.MODEL_SAFETENSORS
    state = load_dcp_state_dict(dcp_dir)
    target = Path(step).parent / "baseline.safetensors"
    ops = {
        "save_file": lambda: save_file(state, str(target), metadata={"format": "pt"}),
        "convert": lambda: convert_checkpoint(step),
        "manifest": lambda: verify_dcp_files(dcp_dir),
        "manifest+load": lambda: load_dcp_state_dict(dcp_dir),
    }
    times: dict[str, list[float]] = {name: [] for name in ops}
    names = list(ops)
    for i in range(repeats):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            target.unlink(missing_ok=True)
            out.unlink(missing_ok=True)
            times[name].append(_timed(ops[name]))
    target.unlink(missing_ok=True)
    out.unlink(missing_ok=True)
    return {
        "times": times,
        "nbytes": sum(v.numel() * v.element_size() for v in state.values()),
        "ntensors": len(state),
    }


def run_child(script: Path, *args: str) -> dict:
    cmd = [sys.executable, str(script), "--_child", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        raise SystemExit(f"benchmark subprocess failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def measure(work: Path, size_mb: float, world_size: int, repeats: int) -> dict:
    step = work / f"{size_mb:g}mb" / "checkpoints" / "000001"
    t = time.perf_counter()
    make_checkpoint(step, size_mb, world_size)
    print(
        f"[{size_mb:g} MB] DCP checkpoint of a {world_size}-rank FSDP2 run in "
        f"{time.perf_counter() - t:.1f} s",
        flush=True,
    )
    script = Path(__file__).resolve()
    rss = run_child(script, "rss", str(step))
    (step / "pretrained_model" / "model.safetensors").unlink()
    times = run_child(script, "times", str(step), str(repeats))
    rss_delete = run_child(script, "rss_delete", str(step))  # last: the shards are gone after it
    shutil.rmtree(step.parent.parent)
    return {"size_mb": size_mb, "rss": rss, "rss_delete": rss_delete, **times}


def report(results: list[dict]) -> bool:
    import torch

    med = statistics.median
    print(f"\ntorch {torch.__version__}; medians (min) in s; peak RSS growth / weights")
    print(
        f"{'weights':>16s} {'save_file':>15s} {'convert':>15s} {'ratio':>6s} "
        f"{'manifest':>8s} {'+load':>7s} {'RSS plain':>10s} {'RSS delete_dcp':>20s}"
    )
    ok = True
    for r in results:
        t, n = r["times"], r["nbytes"]
        ratio = med(t["save_file"]) / med(t["convert"])
        rss, rss_del = r["rss"]["rss_growth"] / n, r["rss_delete"]["rss_growth"] / n
        ok &= rss <= RSS_TARGET and rss_del <= RSS_TARGET
        weights = f"{n / 1e6:.0f} MB/{r['ntensors']}t"
        print(
            f"{weights:>16s} {med(t['save_file']):7.3f} ({min(t['save_file']):5.3f}) "
            f"{med(t['convert']):7.3f} ({min(t['convert']):5.3f}) {ratio:6.2f} "
            f"{med(t['manifest']):8.3f} {med(t['manifest+load']):7.3f} "
            f"{rss:9.2f}x {rss_del:9.2f}x ({r['rss_delete']['s']:5.2f} s)"
        )
        if not (r["rss"]["hwm_reset"] and r["rss_delete"]["hwm_reset"]):
            print("    [VmHWM could not be reset: the RSS figures include the imports]")
    print(
        f"\nratio = save_file / convert (no target); RSS target <= {RSS_TARGET}x: "
        f"{'PASS' if ok else 'MISS'}"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes_mb", default="100,1024")
    parser.add_argument("--repeats", default="7,5", help="rounds per size (one value, or one each)")
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--workdir", default=None, help="folder on the disk to measure")
    parser.add_argument("--check", action="store_true", help="exit 1 when the RSS target is missed")
    parser.add_argument("--_child", nargs="+", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._child:
        kind, step, *rest = args._child
        if kind == "times":
            result = child_times(step, int(rest[0]))
        else:
            result = child_rss(step, delete_dcp=kind == "rss_delete")
        print(json.dumps(result))
        return 0

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sizes = [float(s) for s in args.sizes_mb.split(",")]
    repeats = [int(r) for r in args.repeats.split(",")]
    repeats += [repeats[-1]] * (len(sizes) - len(repeats))
    work = Path(tempfile.mkdtemp(prefix="bench_convert_", dir=args.workdir))
    try:
        results = [
            measure(work, s, args.world_size, r)
            for s, r in zip(sizes, repeats[: len(sizes)], strict=True)
        ]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ok = report(results)
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
