"""tensorfs_offload - offload saved activations to a tensorfs mount (SSDTrain's pattern).

    from tensorfs_offload import TensorfsOffload

    off = TensorfsOffload("/mnt/tfs/act", budget=0.5)     # or bytes, or None: all
    for batch in data:
        with off:
            loss = model(batch)
        loss.backward()
        opt.step()

Inside the context, autograd's saved tensors of at least min_bytes go to
files in the folder with tfs_gpu_write, from a writer thread on its own CUDA
stream (after an event that says the tensor is computed); the GPU memory is
freed once the write returns. Backward reads them back with tfs_gpu_read in
reverse order of saving: the first unpack starts a reader thread, on its own
stream, that keeps `prefetch` tensors ahead of the one backward needs. Each
file is deleted once read, so with tensorfs's lazy write-back (a dirty block
stays in DRAM until its slot is needed) an activation that fits the DRAM tier
never reaches nvme. A file never read (a graph dropped without backward) is
deleted when autograd drops its handle.

The budget picks what goes: bytes (the first tensors saved, whose backward
comes last and so hides their reads best, up to that many bytes), or a
fraction of the step's saved bytes (of the previous step's total; in the first
step, kept at that fraction as tensors come). Parameters, non-contiguous
views and small tensors stay where they are.

libtensorfs-cuda is loaded with ctypes from $TENSORFS_CUDA_LIB (default
libtensorfs-cuda.so.0). On a cuda=on mount it copies between GPU memory and
the daemon's DRAM arena; elsewhere through pinned buffers. For CPU tensors
(tests, --device cpu), point TENSORFS_CUDA_LIB at the library built with the
memcpy engine (build/cuda/libtensorfs-cuda-cpu.so); stream is then NULL.
Needs only PyTorch; works with torch >= 1.13.
"""
import ctypes
import itertools
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import torch

LIB_ENV = "TENSORFS_CUDA_LIB"
LIB_DEFAULT = "libtensorfs-cuda.so.0"
_lib = None
_lib_lock = threading.Lock()


def load_lib(path=None):
    """libtensorfs-cuda through ctypes (once per process)."""
    global _lib
    with _lib_lock:
        if _lib is None:
            lib = ctypes.CDLL(path or os.environ.get(LIB_ENV) or LIB_DEFAULT)
            io = [ctypes.c_int, ctypes.c_longlong, ctypes.c_size_t, ctypes.c_void_p,
                  ctypes.c_void_p]
            for name in ("tfs_gpu_read", "tfs_gpu_write"):
                getattr(lib, name).argtypes = io
                getattr(lib, name).restype = ctypes.c_ssize_t
            lib.tfs_gpu_error.argtypes = []
            lib.tfs_gpu_error.restype = ctypes.c_char_p
            lib.tfs_gpu_path.argtypes = [ctypes.c_int]
            lib.tfs_gpu_path.restype = ctypes.c_int
            _lib = lib
        return _lib


def _io(write, fd, nbytes, ptr, stream):
    lib = load_lib()
    fn = lib.tfs_gpu_write if write else lib.tfs_gpu_read
    n = fn(fd, 0, nbytes, ptr, stream)
    if n != nbytes:
        msg = lib.tfs_gpu_error().decode(errors="replace")
        what = "tfs_gpu_write" if write else "tfs_gpu_read"
        raise OSError(-n if n < 0 else 5, f"{what} of {nbytes} bytes returned {n}: {msg}")


class _Saved:
    """One offloaded tensor: its file, and the futures of its write and read."""

    def __init__(self, owner, step, index, t, path, fd):
        self.owner = owner
        self.step = step          # the list of this forward's handles, in pack order
        self.index = index
        self.shape, self.dtype, self.device = t.shape, t.dtype, t.device
        self.nbytes = t.numel() * t.element_size()
        self.path, self.fd = path, fd
        self.write = None
        self.read = None
        self.lock = threading.Lock()

    def drop(self):
        """Close and delete the file, once (after its read, or unread)."""
        with self.lock:
            fd, self.fd = self.fd, -1
        if fd < 0:
            return
        try:
            if self.write is not None:
                self.write.exception()   # wait: the writer may still use the fd
        finally:
            os.close(fd)
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.owner._file_gone(self.nbytes)

    def __del__(self):
        try:
            self.drop()
        except Exception:
            pass


class TensorfsOffload:
    """saved_tensors_hooks that offload activations to files in folder.

    budget: None (every eligible tensor), an int (bytes per step), or a float
    in (0, 1] (that fraction of the step's eligible saved bytes).
    min_bytes: smaller tensors stay. prefetch: tensors read ahead in backward.
    """

    def __init__(self, folder, budget=None, min_bytes=1 << 20, prefetch=2):
        if isinstance(budget, float) and not 0.0 <= budget <= 1.0:
            raise ValueError("a fractional budget must lie in [0, 1]")
        self.folder = folder
        self.budget = budget
        self.min_bytes = min_bytes
        self.prefetch = max(0, int(prefetch))
        os.makedirs(folder, exist_ok=True)
        load_lib()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="tfs-offload-write")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="tfs-offload-read")
        self._streams = {}
        self._seq = itertools.count()
        self._lock = threading.Lock()   # guards the counters and live files below
        self._hooks = None
        self._last_total = None
        self.files_live = 0
        self.files_created = 0
        self.reset_stats()

    # ---- statistics of the last step (since the last __enter__) ----

    def reset_stats(self):
        self.eligible_bytes = 0    # saved tensors that could have gone
        self.offloaded_bytes = 0   # went to files
        self.kept_bytes = 0        # saved tensors kept in memory (all sizes)
        self.offloaded_tensors = 0

    def _file_gone(self, nbytes):
        with self._lock:
            self.files_live -= 1

    # ---- the context ----

    def __enter__(self):
        if self.eligible_bytes:
            self._last_total = self.eligible_bytes
        self.reset_stats()
        self._step = []
        self._seen = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        self._hooks = None
        self._seen = {}
        return False

    def close(self):
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=True)

    # ---- what goes ----

    def _allowed(self, nbytes):
        b = self.budget
        if b is None:
            return True
        if isinstance(b, float):
            if self._last_total is not None:
                return self.offloaded_bytes + nbytes <= b * self._last_total
            # first step: hold the running fraction
            return self.offloaded_bytes + nbytes <= b * self.eligible_bytes
        return self.offloaded_bytes + nbytes <= b

    def _eligible(self, t):
        if not isinstance(t, torch.Tensor) or t.is_sparse or not t.is_contiguous():
            return False
        if t.requires_grad and t.is_leaf:   # parameters and inputs that persist anyway
            return False
        if t.device.type not in ("cuda", "cpu"):
            return False
        return t.numel() * t.element_size() >= self.min_bytes

    def _stream(self, device, kind):
        if device.type != "cuda":
            return None
        key = (device.index, kind)
        s = self._streams.get(key)
        if s is None:
            s = torch.cuda.Stream(device=device)
            self._streams[key] = s
        return s

    # ---- the hooks ----

    def _pack(self, t):
        nbytes = t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
        if not self._eligible(t):
            self.kept_bytes += nbytes
            return t
        hit = self._seen.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]   # saved twice: one file
        self.eligible_bytes += nbytes
        if not self._allowed(nbytes):
            self.kept_bytes += nbytes
            return t
        path = os.path.join(self.folder, f"act-{os.getpid()}-{next(self._seq)}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        h = _Saved(self, self._step, len(self._step), t, path, fd)
        self._step.append(h)
        with self._lock:
            self.files_live += 1
            self.files_created += 1
        self.offloaded_bytes += nbytes
        self.offloaded_tensors += 1
        ready = None
        if t.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(t.device))
        h.write = self._writer.submit(self._write, h, t, ready)
        try:
            self._seen[id(t)] = (weakref.ref(t), h)
        except TypeError:
            pass
        return h

    def _write(self, h, t, ready):
        stream = self._stream(t.device, "write")
        if stream is not None:
            with torch.cuda.stream(stream):
                stream.wait_event(ready)
                _io(True, h.fd, h.nbytes, t.data_ptr(), stream.cuda_stream)
        else:
            _io(True, h.fd, h.nbytes, t.data_ptr(), None)
        # t goes now: its memory may be reused, the write being done.

    def _read(self, h):
        h.write.result()
        stream = self._stream(h.device, "read")
        if stream is not None:
            with torch.cuda.stream(stream):
                t = torch.empty(h.shape, dtype=h.dtype, device=h.device)
                _io(False, h.fd, h.nbytes, t.data_ptr(), stream.cuda_stream)
        else:
            t = torch.empty(h.shape, dtype=h.dtype, device=h.device)
            _io(False, h.fd, h.nbytes, t.data_ptr(), None)
        h.drop()
        return t

    def _schedule(self, h):
        with h.lock:
            if h.read is None and h.fd >= 0:
                h.read = self._reader.submit(self._read, h)
            return h.read

    def _unpack(self, h):
        if not isinstance(h, _Saved):
            return h
        fut = self._schedule(h)
        if fut is None:
            raise RuntimeError("tensorfs_offload: a saved tensor was read twice "
                               "(backward with retain_graph is not supported)")
        # backward goes in reverse order of saving: read the next ones ahead
        for j in range(h.index - 1, max(-1, h.index - 1 - self.prefetch), -1):
            self._schedule(h.step[j])
        t = fut.result()
        if t.device.type == "cuda":
            # allocated on the read stream, used on this one
            t.record_stream(torch.cuda.current_stream(t.device))
        return t
