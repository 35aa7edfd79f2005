#!/usr/bin/env python3
"""offload_check.py MNT - the activation offloader on CPU tensors (test_gpu_offload.sh).

A tiny MLP trains a few steps twice from the same start: plainly, and with
TensorfsOffload saving its activations to MNT/act through libtensorfs-cuda
built with the memcpy engine ($TENSORFS_CUDA_LIB). The losses and weights
must be bitwise equal; files must exist on the mount between forward and
backward and none after; a byte budget must bound what goes; nvme0 must
have written nothing (the files die in DRAM). A tensor saved twice, two
forwards before one backward and a graph dropped without backward give
the same gradients and leave no file; a second backward (retain_graph)
is refused with a message. Exit 0 pass, 1 fail.
"""
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.environ["OFFLOAD_MODULE_DIR"])
import torch  # noqa: E402
from tensorfs_offload import TensorfsOffload, load_lib  # noqa: E402

MNT = sys.argv[1]
ACT = os.path.join(MNT, "act")
STEPS = 4


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def nvme_written():
    with open(os.path.join(MNT, ".tensorfs", "stats")) as f:
        return json.load(f)["tiers"]["nvme0"]["write_bytes"]


def model():
    torch.manual_seed(1)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256),
                   torch.nn.LayerNorm(256)]
    return torch.nn.Sequential(*layers)


def train(off=None, check_files=False):
    torch.manual_seed(2)
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    x = torch.randn(64, 256)
    y = torch.randn(64, 256)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        if off is None:
            loss = torch.nn.functional.mse_loss(m(x), y)
        else:
            with off:
                loss = torch.nn.functional.mse_loss(m(x), y)
            if check_files:
                if not os.listdir(ACT):
                    fail("no activation files on the mount after forward")
        loss.backward()
        if off is not None and check_files:
            left = os.listdir(ACT)
            if left:
                fail(f"files left after backward: {left[:5]}")
        opt.step()
        losses.append(loss.detach().clone())
    return losses, [p.detach().clone() for p in m.parameters()]


os.makedirs(ACT, exist_ok=True)
probe = os.open(os.path.join(ACT, "probe"), os.O_RDWR | os.O_CREAT, 0o600)
if load_lib().tfs_gpu_path(probe) != 1:
    fail("the offloader would not use the zero-copy path on a cuda=on mount")
os.close(probe)
os.unlink(os.path.join(ACT, "probe"))
w0 = nvme_written()
base_loss, base_w = train()

# everything above 64 KiB goes (each step saves 16 tensors of 64 x 1024 floats: 256 KiB)
off = TensorfsOffload(ACT, budget=None, min_bytes=64 << 10, prefetch=2)
loss, w = train(off, check_files=True)
if not all(torch.equal(a, b) for a, b in zip(loss, base_loss)):
    fail(f"losses differ: {[float(v) for v in loss]} vs {[float(v) for v in base_loss]}")
if not all(torch.equal(a, b) for a, b in zip(w, base_w)):
    fail("weights differ after training with offloading")
if off.offloaded_tensors == 0 or off.files_created < STEPS:
    fail(f"nothing offloaded ({off.offloaded_tensors} tensors, {off.files_created} files)")
if off.files_live != 0:
    fail(f"{off.files_live} files still open after backward")
full = off.offloaded_bytes
print(f"offload: {off.offloaded_tensors} tensors, {full} bytes per step; "
      f"{off.files_created} files in {STEPS} steps")

# a byte budget bounds what goes, and the rest stays
budget = full // 3
off2 = TensorfsOffload(ACT, budget=budget, min_bytes=64 << 10)
loss, _ = train(off2, check_files=True)
if not 0 < off2.offloaded_bytes <= budget:
    fail(f"budget {budget}: offloaded {off2.offloaded_bytes}")
if not all(torch.equal(a, b) for a, b in zip(loss, base_loss)):
    fail("losses differ with a budget")
# a fraction of the step's saved bytes
off3 = TensorfsOffload(ACT, budget=0.5, min_bytes=64 << 10)
train(off3, check_files=True)
if not 0 < off3.offloaded_bytes <= 0.5 * off3.eligible_bytes:
    fail(f"budget 0.5: offloaded {off3.offloaded_bytes} of {off3.eligible_bytes}")
print(f"budget: {off2.offloaded_bytes} of at most {budget} bytes; "
      f"0.5: {off3.offloaded_bytes} of {off3.eligible_bytes}")


def grads_of(fn, off=None):
    """fn's loss and the gradients of its parameters, with or without offloading."""
    torch.manual_seed(3)
    m = model()
    x = torch.randn(64, 256)
    if off is None:
        loss = fn(m, x)
    else:
        with off:
            loss = fn(m, x)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in m.parameters()]


def same(a, b, what):
    if not torch.equal(a[0], b[0]) or not all(torch.equal(u, v) for u, v in zip(a[1], b[1])):
        fail(f"{what}: loss or gradients differ from no offloading")


def wait_empty(what):
    for _ in range(100):   # 10 s at most: the writer lets go of a handle once written
        if not os.listdir(ACT):
            return
        time.sleep(0.1)
    fail(f"{what}: files left: {os.listdir(ACT)[:5]}")


# A tensor saved twice (h * h saves h as both operands): one file, read once
# for both, and the gradient right.
def squared(m, x):
    h = m(x)
    return (h * h).mean()


off4 = TensorfsOffload(ACT, budget=None, min_bytes=64 << 10)
same(grads_of(squared, off4), grads_of(squared), "a tensor saved twice")
wait_empty("a tensor saved twice")

# Two forwards before one backward (gradient accumulation): two steps live at once.
def twice(m, x, off=None):
    losses = []
    for scale in (1.0, 0.5):
        if off is None:
            losses.append(m(x * scale).pow(2).mean())
        else:
            with off:
                losses.append(m(x * scale).pow(2).mean())
    return losses[0] + losses[1]


same(grads_of(lambda m, x: twice(m, x, off4)), grads_of(twice), "two forwards, one backward")
wait_empty("two forwards, one backward")

# A graph dropped without backward: its files go when autograd drops the handles.
torch.manual_seed(3)
m = model()
with off4:
    loss = m(torch.randn(64, 256)).pow(2).mean()
del loss
gc.collect()
wait_empty("a graph dropped without backward")

# retain_graph: the second backward is refused with a message, not wrong data.
with off4:
    loss = m(torch.randn(64, 256)).pow(2).mean()
loss.backward(retain_graph=True)
try:
    loss.backward()
    fail("a second backward through offloaded tensors was not refused")
except RuntimeError as e:
    if "retain_graph" not in str(e):
        raise
del loss
gc.collect()
wait_empty("retain_graph")
print("offload: saved twice, two forwards, a dropped graph and retain_graph: ok")
for o in (off, off2, off3, off4):
    o.close()

# the files died in DRAM: nothing reached nvme
os.sync()
w1 = nvme_written()
if w1 != w0:
    fail(f"nvme0 wrote {w1 - w0} bytes for activations that fit DRAM")
print("offload: ok")
