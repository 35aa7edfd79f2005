#!/usr/bin/env python3
"""offload_demo.py - activation offloading to tensorfs against keeping them, and save_on_cpu.

Trains a stack of plain-PyTorch transformer blocks (pre-norm attention and a
4x GELU MLP) with SGD for a few steps, and reports for each way of holding
the activations saved for backward: peak memory, ms per step (median of the
steps after the first) and the loss of the last step.

  none          autograd keeps them in device memory
  save_on_cpu   torch.autograd.graph.save_on_cpu(pin_memory=True) (GPU only)
  tensorfs@B    cuda/tensorfs_offload.py: up to the fraction B of the saved
                bytes go to files on --mount, read back ahead in backward

The anchor: --layers 12 --hidden 2048 --heads 16 --seq 2048 --batch 8 (the
default), and --hidden 4096. On a GPU, peak memory is
torch.cuda.max_memory_allocated; with --device cpu (for a machine without
one: use TENSORFS_CUDA_LIB=build/cuda/libtensorfs-cuda-cpu.so and small
sizes) it is the saved bytes kept in memory, as the offloader counts them.

  python3 offload_demo.py --mount /mnt/tfs [--budgets 0.25,0.5,1.0] [--steps 5]
  TENSORFS_CUDA_LIB=build/cuda/libtensorfs-cuda-cpu.so python3 offload_demo.py \\
      --device cpu --dtype float32 --layers 2 --hidden 128 --heads 4 --seq 64 --batch 2 \\
      --mount /mnt/tfs
"""
import argparse
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tensorfs_offload import TensorfsOffload  # noqa: E402


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


def run(args, mode, budget):
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(args.hidden, args.heads) for _ in range(args.layers)])
    model = model.to(dev, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.seq, args.hidden, device=dev, dtype=dtype)
    off = None
    if mode == "tensorfs":
        off = TensorfsOffload(os.path.join(args.mount, "offload-demo"), budget=budget,
                              min_bytes=args.min_bytes, prefetch=args.prefetch)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, loss, peak_saved = [], None, 0
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
        if off is not None:
            peak_saved = max(peak_saved, off.kept_bytes)
        loss.backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = peak_saved if off is not None else saved_bytes(model, x)
    ms = statistics.median(times[1:] if len(times) > 1 else times)
    moved = off.offloaded_bytes if off is not None else 0
    if off is not None:
        off.close()
    return peak, ms, float(loss), moved


def saved_bytes(model, x):
    """Bytes autograd saves for one forward (CPU: what 'none' keeps)."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return total[0]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mount", required=True, help="a tensorfs mount (cuda=on for zero-copy)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--budgets", default="0.25,0.5,0.75,1.0",
                   help="fractions of the saved bytes to offload, comma-separated")
    p.add_argument("--min-bytes", type=int, default=1 << 20)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--modes", default="none,save_on_cpu,tensorfs")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("offload_demo.py: no CUDA device; use --device cpu with small sizes")
    modes = args.modes.split(",")
    print(f"offload_demo: {args.layers} blocks, hidden {args.hidden}, {args.heads} heads, "
          f"seq {args.seq}, batch {args.batch}, {args.dtype}, {args.device}, "
          f"{args.steps} steps")
    print(f"{'way':<18} {'peak MiB':>10} {'ms/step':>10} {'offloaded MiB':>14} {'loss':>12}")
    rows = []
    if "none" in modes:
        rows.append(("none", None))
    if "save_on_cpu" in modes and args.device == "cuda":
        rows.append(("save_on_cpu", None))
    if "tensorfs" in modes:
        rows += [("tensorfs", float(b)) for b in args.budgets.split(",") if b]
    for mode, budget in rows:
        peak, ms, loss, moved = run(args, mode, budget)
        name = mode if budget is None else f"tensorfs@{budget:g}"
        print(f"{name:<18} {peak / 2**20:>10.1f} {ms:>10.1f} {moved / 2**20:>14.1f} "
              f"{loss:>12.6g}", flush=True)


if __name__ == "__main__":
    main()
