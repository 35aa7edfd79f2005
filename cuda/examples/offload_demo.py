#!/usr/bin/env python3
"""offload_demo.py - the curve of peak memory against step time when activations go to tensorfs.

Trains a stack of plain-PyTorch transformer blocks (pre-norm attention and a
4x GELU MLP) with SGD for a few steps, and reports for each way of holding
the activations saved for backward: peak memory, the activations' share of
it, ms per step (median of the steps after the first) and the loss of the
last step.

  none          autograd keeps them in device memory
  save_on_cpu   torch.autograd.graph.save_on_cpu(pin_memory=True) (GPU only)
  tensorfs@B    cuda/tensorfs_offload.py: the budget B (a fraction of the
                saved bytes, or auto: what the copies can hide behind the
                compute, learned in the first steps) goes to files on
                --mount, read back ahead in backward

"copy wait" is the time a step of the offloader spent waiting for copies
(the forward at its window, backward for reads; median of the steps after
the first): near 0 when the copies hide behind the compute. For each
--hidden (a comma-separated list) it prints a table, and with
--plot FILE draws peak memory against ms per step, one curve per hidden
(matplotlib); --table FILE also writes the tables as markdown.

Memory, measured from outside the offloader. On a GPU:
torch.cuda.max_memory_allocated, every way in this process (the allocator's
peak is reset between them, and its cache emptied). With --device cpu (for a
machine without a GPU: TENSORFS_CUDA_LIB=build/cuda/libtensorfs-cuda-cpu.so,
small sizes, and TENSORFS_CPU_COPY_GBPS to make its copies as slow as a
GPU's): each way runs in a process of its own with MALLOC_MMAP_THRESHOLD_
set low (freed tensors leave at once), and a thread reads its RssAnon every
2 ms. "act" is the peak less the memory before the first step (the model
and the batch): the activations, the gradients and the temporaries.

The anchor: --layers 12 --hidden 2048,4096 --heads 16 --seq 2048 --batch 8.

  python3 offload_demo.py --mount /mnt/tfs --hidden 2048,4096 --plot curve.svg
  TENSORFS_CUDA_LIB=build/cuda/libtensorfs-cuda-cpu.so TENSORFS_CPU_COPY_GBPS=1 \\
    python3 offload_demo.py --device cpu --dtype float32 --layers 4 --hidden 256,512 \\
      --heads 4 --seq 256 --batch 4 --mount /mnt/tfs --plot cpu.svg
"""
import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tensorfs_offload import TensorfsOffload  # noqa: E402

MIB = 1 << 20
SAMPLE_S = 0.002
CPU_MMAP_THRESHOLD = "65536"


class Block(torch.nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.ln2 = torch.nn.LayerNorm(hidden)
        self.up = torch.nn.Linear(hidden, 4 * hidden)
        self.down = torch.nn.Linear(4 * hidden, hidden)

    def attention(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
        if sdpa is not None:
            o = sdpa(q, k, v, is_causal=True)
        else:   # torch 1.13
            a = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
            o = a.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.proj(o.transpose(1, 2).reshape(b, s, h))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


def rss_anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


class RssPeak(threading.Thread):
    """The highest RssAnon seen since start(), sampled every SAMPLE_S."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak = 0
        self.done = False

    def run(self):
        while not self.done:
            self.peak = max(self.peak, rss_anon())
            time.sleep(SAMPLE_S)

    def stop(self):
        self.done = True
        self.join()
        return max(self.peak, rss_anon())


def run(args, hidden, mode, budget):
    """One way at one size: {peak, base, ms, loss, moved}; peak, base in bytes."""
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(hidden, args.heads) for _ in range(args.layers)])
    model = model.to(dev, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.seq, hidden, device=dev, dtype=dtype)
    off = None
    if mode == "tensorfs":
        off = TensorfsOffload(os.path.join(args.mount, "offload-demo"), budget=budget,
                              min_bytes=args.min_bytes, read_ahead=args.read_ahead)
    sampler = None
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = rss_anon()
        sampler = RssPeak()
        sampler.start()
    times, waits, loss = [], [], None
    for _ in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if mode == "none":
            out = model(x)
        elif mode == "save_on_cpu":
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                out = model(x)
        else:
            with off:
                out = model(x)
        loss = out.float().pow(2).mean()
        del out
        loss.backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        if off is not None:
            waits.append(sum(off.waits) * 1e3)
    peak = torch.cuda.max_memory_allocated() if dev.type == "cuda" else sampler.stop()
    ms = statistics.median(times[1:] if len(times) > 1 else times)
    row = {"peak": peak, "base": base, "ms": ms, "loss": float(loss),
           "moved": off.offloaded_bytes if off is not None else 0,
           "wait": statistics.median(waits[1:] if len(waits) > 1 else waits) if waits else None}
    if off is not None:
        row["learned"] = {"d2h_GBps": off.d2h_rate and off.d2h_rate / 1e9,
                          "h2d_GBps": off.h2d_rate and off.h2d_rate / 1e9,
                          "forward_ms": off.fwd_s and off.fwd_s * 1e3,
                          "backward_ms": off.bwd_s and off.bwd_s * 1e3}
        off.close()
    return row


def run_isolated(args, hidden, mode, budget):
    """run() in a process of its own, so that its RssAnon is its own."""
    spec = mode if budget is None else f"{mode}@{budget}"
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=CPU_MMAP_THRESHOLD)
    r = subprocess.run([sys.executable, os.path.abspath(__file__)] + sys.argv[1:]
                       + ["--one", spec, "--hidden", str(hidden)],
                       env=env, stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        return {"error": f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_here(args, hidden, mode, budget):
    try:
        return run(args, hidden, mode, budget)
    except RuntimeError as e:   # torch.cuda.OutOfMemoryError is one
        if "out of memory" not in str(e):
            raise
        return {"error": "out of memory"}
    finally:
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()


def parse_budget(b):
    return "auto" if b == "auto" else float(b)


def table(args, hidden, rows):
    """The markdown table of one size; rows: (name, result)."""
    unit = "GPU max_memory_allocated" if args.device == "cuda" else "RssAnon"
    none = next((r for n, r in rows if n == "none" and "error" not in r), None)
    out = [f"offload_demo: {args.layers} blocks, hidden {hidden}, {args.heads} heads, "
           f"seq {args.seq}, batch {args.batch}, {args.dtype}, {args.device}, "
           f"{args.steps} steps; peak: {unit}", "",
           "| way | peak MiB | act MiB | act vs none | ms/step | time vs none "
           "| copy wait ms | offloaded MiB | loss |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows:
        if "error" in r:
            out.append(f"| {name} | {r['error']} | | | | | | | |")
            continue
        act = r["peak"] - r["base"]
        vs_act = vs_ms = ""
        if none is not None and name != "none":
            none_act = none["peak"] - none["base"]
            vs_act = f"{(act - none_act) / none_act * 100:+.0f}%" if none_act > 0 else ""
            vs_ms = f"{r['ms'] / none['ms']:.2f}x"
        same = "" if none is None or r["loss"] == none["loss"] else " (differs)"
        wait = "" if r.get("wait") is None else f"{r['wait']:,.0f}"
        out.append(f"| {name} | {r['peak'] / MIB:,.0f} | {act / MIB:,.0f} | {vs_act} "
                   f"| {r['ms']:,.0f} | {vs_ms} | {wait} | {r['moved'] / MIB:,.0f} "
                   f"| {r['loss']:.6g}{same} |")
    return "\n".join(out) + "\n"


def plot(path, curves, args):
    """Peak memory against ms per step: one line per hidden through the budgets."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"offload_demo: no matplotlib: {path} not drawn", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = max((r["peak"] for rows in curves.values() for _, r in rows if "error" not in r),
              default=0)
    unit, scale = ("GiB", MIB * 1024) if top >= 4 * MIB * 1024 else ("MiB", MIB)
    for hidden, rows in curves.items():
        pts = [(n, r) for n, r in rows if "error" not in r]
        line = [(r["ms"], r["peak"] / scale, n) for n, r in pts
                if n.startswith("tensorfs@") and n != "tensorfs@auto"]
        line.sort(key=lambda p: -p[1])
        drawn = ax.plot([p[0] for p in line], [p[1] for p in line], "o-",
                        label=f"hidden {hidden}: tensorfs budgets")
        color = drawn[0].get_color()
        for ms, gib, n in line:
            ax.annotate(n.split("@")[1], (ms, gib), textcoords="offset points", xytext=(4, 4),
                        fontsize=8)
        for n, r in pts:
            marker = {"none": "s", "save_on_cpu": "^", "tensorfs@auto": "*"}.get(n)
            if marker:
                ax.plot(r["ms"], r["peak"] / scale, marker, color=color, markersize=9,
                        label=f"hidden {hidden}: {n}")
    ax.set_xlabel("ms per step")
    ax.set_ylabel("peak memory, %s (%s)" % (unit, "GPU" if args.device == "cuda" else "RssAnon"))
    ax.set_title(f"activation offloading: {args.layers} blocks, seq {args.seq}, "
                 f"batch {args.batch}, {args.dtype}, {args.device}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    print(f"offload_demo: plot in {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mount", required=True, help="a tensorfs mount (cuda=on for zero-copy)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", default="2048", help="sizes, comma-separated")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--budgets", default="0.25,0.5,0.75,1.0,auto",
                   help="fractions of the saved bytes to offload, or auto, comma-separated")
    p.add_argument("--min-bytes", type=int, default=1 << 20)
    p.add_argument("--read-ahead", type=int, default=None,
                   help="bytes read ahead in backward (default: the offloader's own)")
    p.add_argument("--modes", default="none,save_on_cpu,tensorfs")
    p.add_argument("--isolate", action="store_true",
                   help="each way in a process of its own (always with --device cpu)")
    p.add_argument("--plot", help="draw the curve into this file (.svg, .png)")
    p.add_argument("--table", help="write the tables to this markdown file")
    p.add_argument("--one", help=argparse.SUPPRESS)   # MODE[@BUDGET]: one way, JSON out
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("offload_demo.py: no CUDA device; use --device cpu with small sizes")
    if args.one:
        mode, _, b = args.one.partition("@")
        print(json.dumps(run(args, int(args.hidden), mode, parse_budget(b) if b else None)))
        return
    modes = args.modes.split(",")
    ways = []
    if "none" in modes:
        ways.append(("none", None))
    if "save_on_cpu" in modes and args.device == "cuda":
        ways.append(("save_on_cpu", None))
    if "tensorfs" in modes:
        ways += [("tensorfs", parse_budget(b)) for b in args.budgets.split(",") if b]
    isolate = args.isolate or args.device == "cpu"
    curves, text = {}, []
    for hidden in [int(h) for h in args.hidden.split(",") if h]:
        rows = []
        for mode, budget in ways:
            name = mode if budget is None else f"tensorfs@{budget:g}" if budget != "auto" \
                else "tensorfs@auto"
            fn = run_isolated if isolate else run_here
            rows.append((name, fn(args, hidden, mode, budget)))
            r = rows[-1][1]
            if "error" not in r:
                print(f"  hidden {hidden} {name}: peak {r['peak'] / MIB:,.0f} MiB, "
                      f"{r['ms']:,.0f} ms/step" + (f", learned {r['learned']}"
                                                   if r.get("learned") else ""),
                      file=sys.stderr, flush=True)
        curves[hidden] = rows
        text.append(table(args, hidden, rows))
        print(text[-1], flush=True)
    if args.table:
        with open(args.table, "w") as f:
            f.write("\n".join(text))
    if args.plot:
        plot(args.plot, curves, args)
    bad = [f"hidden {h} {n}" for h, rows in curves.items() for n, r in rows
           if "error" not in r and any(n0 == "none" and "error" not in r0 and r0["loss"] != r["loss"]
                                       for n0, r0 in rows)]
    if bad:
        print("offload_demo: the loss differs from none's: " + ", ".join(bad), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
