#!/usr/bin/env python3
"""offload_mem.py MNT MODE STEPS - real memory of one way of keeping activations.

One process per mode (test_gpu_offload.sh runs them), with
MALLOC_MMAP_THRESHOLD_ set low by the caller so that a freed tensor goes
back to the kernel at once. A thread reads RssAnon from /proc/self/status
every 2 ms; RssAnon leaves out the daemon's arena that the library maps
(shared memory), so it is the process's own tensors and heap.

The model: LAYERS tanh layers on CPU tensors of TENSOR_MIB each, after an
add of a parameter (so that autograd saves each tanh's output, LAYERS
tensors a step, and nothing else of that size). MODE:
  none       autograd keeps them
  B          cuda/tensorfs_offload.py with budget B (a fraction, or "auto")
Prints one JSON line: the RssAnon before the first step, the peak of each
step, the saved bytes a step (counted by a hook of this script, not the
offloader), the offloader's chosen bytes, the loss of each step, its
time and the offloader's waits for copies in it.
"""
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.environ["OFFLOAD_MODULE_DIR"])
import torch  # noqa: E402

LAYERS = 16
TENSOR_MIB = 8
SAMPLE_S = 0.002

MNT, MODE, STEPS = sys.argv[1], sys.argv[2], int(sys.argv[3])


def rss_anon_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc/self/status")


class Sampler(threading.Thread):
    """The peak RssAnon of each phase; phase -1 is before the first step."""

    def __init__(self):
        super().__init__(daemon=True)
        self.phase = -1
        self.peaks = {}
        self.stop = False

    def run(self):
        while not self.stop:
            v = rss_anon_kib()
            p = self.phase
            if v > self.peaks.get(p, 0):
                self.peaks[p] = v
            time.sleep(SAMPLE_S)


def forward(x, p):
    h = x + p
    for _ in range(LAYERS):
        h = torch.tanh(h)
    return h.sum()


def saved_bytes(x, p):
    total = [0]

    def pack(t):
        if t.numel() * t.element_size() >= 1 << 20:
            total[0] += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward(x, p)
    return total[0]


torch.manual_seed(0)
torch.set_num_threads(1)
x = torch.randn(TENSOR_MIB << 18)     # floats of 4 bytes
p = torch.zeros(1, requires_grad=True)
saved = saved_bytes(x, p)

off = None
if MODE != "none":
    from tensorfs_offload import TensorfsOffload
    budget = MODE if MODE == "auto" else float(MODE)
    off = TensorfsOffload(os.path.join(MNT, "mem"), budget=budget, min_bytes=1 << 20)

s = Sampler()
time.sleep(0.05)
s.start()
time.sleep(0.05)
losses, chosen, grads, ms, waits = [], [], [], [], []
for step in range(STEPS):
    s.phase = step
    t0 = time.perf_counter()
    if off is None:
        loss = forward(x, p)
    else:
        with off:
            loss = forward(x, p)
        chosen.append(off.offloaded_bytes)
    loss.backward()
    losses.append(loss.item())
    grads.append(p.grad.item())
    p.grad = None
    del loss
    ms.append((time.perf_counter() - t0) * 1e3)
    if off is not None and hasattr(off, "waits"):
        waits.append(round(sum(off.waits) * 1e3, 1))
    time.sleep(0.02)   # a sample after the step's last free
s.phase = STEPS
time.sleep(0.05)
s.stop = True
s.join()
if off is not None:
    off.close()
print(json.dumps({"mode": MODE, "before_kib": s.peaks.get(-1),
                  "peaks_kib": [s.peaks.get(i) for i in range(STEPS)],
                  "saved_bytes": saved, "chosen_bytes": chosen,
                  "losses": losses, "grads": grads, "ms": [round(v, 1) for v in ms],
                  "waits_ms": waits,
                  "learned": None if off is None else {   # None where the offloader learns not
                      k: getattr(off, k, None)
                      for k in ("d2h_rate", "h2d_rate", "fwd_s", "bwd_s", "target_bytes")}}))
