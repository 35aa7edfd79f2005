"""tensorfs_offload - offload saved activations to a tensorfs mount (SSDTrain's pattern).

    from tensorfs_offload import TensorfsOffload

    off = TensorfsOffload("/mnt/tfs/act")        # budget="auto": what the copies can hide
    for batch in data:
        with off:
            loss = model(batch)
        loss.backward()
        opt.step()

Inside the context, autograd's saved tensors of at least min_bytes are
handed to a writer thread that creates a file in the folder and copies the
tensor there with tfs_gpu_write, on its own CUDA stream, once an event says
the tensor is computed. The handle drops the tensor as soon as its write
returns, so that its memory is freed: nothing else keeps it.

The window. A forward can produce saved tensors faster than they are
written (on an H100, about 10 GB in 40 ms against 50 GB/s of D2H); every
tensor waiting for its write still holds its memory. So the bytes saved
and not yet written are bounded: a save that would pass the window waits
for the oldest write to end. A tensor whose write has not started when
backward wants it stays where it is: its write is cancelled, and backward
gets it without a read.

Backward reads the tensors back in reverse order of saving, with
tfs_gpu_read, from a reader thread on its own stream, so that the D2H of
the last forward tensors and the H2D of the first backward ones can use
both copy engines. Reads run ahead of backward by bytes: a base of two of
the largest tensors, plus the bytes of the kept tensors backward has used
already (those are freed, so reading ahead by as much costs no more
memory than not offloading). Each file is deleted once read, so with
tensorfs's lazy write-back an activation that fits the DRAM tier never
reaches nvme. The handle holds the read-back tensor only until backward
takes it; a file never read (a graph dropped without backward) is deleted
when autograd drops its handle.

What goes. The first tensors saved go: their backward comes last, which
hides their reads best. budget says how many bytes:
  "auto" (the default)  learned: the first step offloads everything (the
        least memory while nothing is known); each step measures the D2H
        and H2D rates (bytes over the time inside tfs_gpu_write and
        tfs_gpu_read) and the forward's and backward's compute (their
        time less the time spent waiting for copies); the next step
        offloads 0.9 x min(D2H x forward, H2D x backward) bytes, what the
        copies can move while the compute runs, as SSDTrain does, and the
        window is then as large as the copies lag at that rate.
  a float in [0, 1]     that fraction of the step's eligible saved bytes
        (of the previous step's total; in the first step, held as
        tensors come)
  an int                that many bytes per step
  None                  every eligible tensor (as 1.0)
Parameters, non-contiguous views and tensors under min_bytes stay.

window (bytes; None: auto) bounds the bytes saved and not yet written:
two of the largest tensors, or under "auto" as much as the copies lag at
the learned budget. read_ahead (bytes; None: auto) is the reads' base.

libtensorfs-cuda is loaded with ctypes from $TENSORFS_CUDA_LIB (default
libtensorfs-cuda.so.0). On a cuda=on mount it copies between GPU memory and
the daemon's DRAM arena; elsewhere through pinned buffers. For CPU tensors
(tests, --device cpu), point TENSORFS_CUDA_LIB at the library built with the
memcpy engine (build/cuda/libtensorfs-cuda-cpu.so; TENSORFS_CPU_COPY_GBPS
makes its copies as slow as a GPU's); stream is then NULL.
Needs only PyTorch; works with torch >= 1.13.
"""
import collections
import ctypes
import itertools
import os
import threading
import time
import traceback
import warnings
import weakref

import torch

LIB_ENV = "TENSORFS_CUDA_LIB"
LIB_DEFAULT = "libtensorfs-cuda.so.0"
AUTO_MARGIN = 0.9      # of what the copies can move while the compute runs
RATE_EMA = 0.5         # weight of the last step in the learned rates and times
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


def _nbytes(t):
    return t.numel() * t.element_size()


class _Lane:
    """One named thread that runs its jobs in order (the writer, the reader)."""

    def __init__(self, name):
        self._jobs = collections.deque()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, arg):
        with self._cv:
            if self._closed:
                raise RuntimeError("tensorfs_offload: used after close()")
            self._jobs.append((fn, arg))
            self._cv.notify()

    def _run(self):
        while True:
            with self._cv:
                while not self._jobs and not self._closed:
                    self._cv.wait()
                if not self._jobs:
                    return
                fn, arg = self._jobs.popleft()
            try:
                fn(arg)
            except BaseException:   # a job's own errors are its handle's; this is a bug
                traceback.print_exc()
            del fn, arg   # the job's handle must not wait here for the next job

    def close(self):
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()


class _Step:
    """One forward's offloaded tensors, and what backward has read of them.

    Handles point here; the list points back only weakly, so that a step
    dies with the last handle autograd drops, without the cycle collector.
    """

    def __init__(self, number, device):
        self.number = number
        self.device = device      # of the tensors offloaded (the last step's at first)
        self.handles = []         # weakrefs to _Saved, in order of saving
        self.cursor = None        # the next handle to read ahead, going down
        self.ahead = 0            # bytes read (or kept) ahead and not yet taken
        self.credit = 0           # bytes of kept tensors that backward has taken
        self.largest = 0          # the largest offloaded tensor
        # timings: forward [enter, exit), backward [first, last unpack)
        self.fwd = [None, None]   # perf_counter, or CUDA events
        self.bwd = [None, None]
        self.fwd_wait = 0.0       # seconds _pack waited for the window
        self.bwd_wait = 0.0       # seconds _unpack waited for reads
        self.eligible = 0
        self.offloaded = 0


class _Kept:
    """A tensor that could have gone but stays (the budget): backward's use credits reads."""

    __slots__ = ("t", "step", "nbytes")

    def __init__(self, t, step, nbytes):
        self.t, self.step, self.nbytes = t, step, nbytes


QUEUED, WRITING, WRITTEN, KEPT, FAILED = range(5)


class _Saved:
    """One offloaded tensor: the tensor until written, its file, and its read."""

    def __init__(self, owner, step, index, t, ready):
        self.owner = owner
        self.step = step
        self.index = index
        self.shape, self.dtype, self.device = t.shape, t.dtype, t.device
        self.nbytes = _nbytes(t)
        self.lock = threading.Lock()
        self.t = t                # the tensor: until written, or once read back
        self.ready = ready        # CUDA event: the tensor is computed
        self.state = QUEUED
        self.want = False         # backward asked for it while it was written: keep t
        self.uses = 1             # packs of it, less unpacks
        self.issued = False       # its read (or its keeping) is under way
        self.loaded = threading.Event()   # t is there for backward
        self.error = None
        self.path, self.fd = None, -1

    def drop(self):
        """Close and delete the file, once."""
        with self.lock:
            fd, self.fd = self.fd, -1
        if fd < 0:
            return
        os.close(fd)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self.owner._file_gone()

    def __del__(self):
        try:
            self.drop()
        except Exception:
            pass


class TensorfsOffload:
    """saved_tensors_hooks that offload activations to files in folder.

    budget: "auto" (default), None (all), a float in [0, 1] (that fraction
    of the step's eligible saved bytes) or an int (bytes per step).
    window: bytes saved and not yet written, at most (None: auto).
    read_ahead: bytes backward reads ahead, at least (None: auto).
    min_bytes: smaller tensors stay. prefetch: read_ahead in tensors, for
    callers of the earlier interface.
    """

    def __init__(self, folder, budget="auto", min_bytes=1 << 20, window=None,
                 read_ahead=None, prefetch=None):
        if isinstance(budget, float) and not 0.0 <= budget <= 1.0:
            raise ValueError("a fractional budget must lie in [0, 1]")
        if isinstance(budget, str) and budget != "auto":
            raise ValueError(f"budget {budget!r}: want 'auto', None, a fraction or bytes")
        self.folder = folder
        self.budget = budget
        self.min_bytes = min_bytes
        self.window = window
        self.read_ahead = read_ahead
        self.prefetch = prefetch
        os.makedirs(folder, exist_ok=True)
        load_lib()
        self._writer = _Lane("tfs-offload-write")
        self._reader = _Lane("tfs-offload-read")
        self._streams = {}
        self._seq = itertools.count()
        self._steps = itertools.count(1)
        self._lock = threading.Condition()   # guards the window and the counters below
        self._pending = 0                    # bytes saved and not yet written
        self._hooks = None
        self._step = None
        self._last_total = None
        self._largest = 0
        self._device = None
        # learned (budget "auto"): bytes per second, seconds; None until measured
        self.d2h_rate = self.h2d_rate = None
        self.fwd_s = self.bwd_s = None
        self.target_bytes = None            # what "auto" offloads next step
        self.files_live = 0
        self.files_created = 0
        self.write_errors = 0
        self._io_lock = threading.Lock()     # guards the copy counters
        self._copy = [0, 0.0, 0, 0.0]        # D2H bytes, seconds; H2D bytes, seconds
        self.reset_stats()

    # ---- statistics of the last step (since the last __enter__) ----

    def reset_stats(self):
        self.eligible_bytes = 0    # saved tensors that could have gone
        self.offloaded_bytes = 0   # chosen to go (a cancelled write stays chosen)
        self.kept_bytes = 0        # saved tensors kept in memory (all sizes)
        self.offloaded_tensors = 0

    @property
    def waits(self):
        """Seconds this step waited for copies: (forward at the window, backward for reads)."""
        step = self._step
        return (step.fwd_wait, step.bwd_wait) if step is not None else (0.0, 0.0)

    def _file_gone(self):
        with self._lock:
            self.files_live -= 1

    # ---- the context ----

    def __enter__(self):
        if self.eligible_bytes:
            self._last_total = self.eligible_bytes
        if self._step is not None:
            self._learn(self._step)
        self.reset_stats()
        self._step = _Step(next(self._steps), self._device)
        self._step.fwd[0] = self._clock(self._step)
        self._seen = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        self._hooks = None
        self._seen = {}
        self._step.fwd[1] = self._clock(self._step)
        self._step.eligible = self.eligible_bytes
        self._step.offloaded = self.offloaded_bytes
        return False

    def close(self):
        self._writer.close()
        self._reader.close()

    # ---- timing and learning ----

    @staticmethod
    def _clock(step):
        """Now, for a span of step: the wall clock, and the GPU's where CUDA runs."""
        ev = None
        if step.device is not None and step.device.type == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(step.device))
        return (time.perf_counter(), ev)

    @staticmethod
    def _span(pair):
        """Seconds between two _clock()s: the GPU's time where both have an event."""
        a, b = pair
        if a is None or b is None:
            return None
        if a[1] is not None and b[1] is not None:
            b[1].synchronize()
            return a[1].elapsed_time(b[1]) / 1e3
        return b[0] - a[0]

    def _learn(self, step):
        """Fold the step's rates and times into what "auto" decides."""
        with self._io_lock:
            wb, ws, rb, rs = self._copy
            self._copy = [0, 0.0, 0, 0.0]

        def ema(old, new):
            return new if old is None else RATE_EMA * new + (1 - RATE_EMA) * old
        if wb and ws > 0:
            self.d2h_rate = ema(self.d2h_rate, wb / ws)
        if rb and rs > 0:
            self.h2d_rate = ema(self.h2d_rate, rb / rs)
        fwd, bwd = self._span(step.fwd), self._span(step.bwd)
        if fwd is not None:
            self.fwd_s = ema(self.fwd_s, max(fwd - step.fwd_wait, 0.0))
        if bwd is not None:
            self.bwd_s = ema(self.bwd_s, max(bwd - step.bwd_wait, 0.0))
        self.last_step = {"step": step.number, "forward_s": fwd, "backward_s": bwd,
                          "forward_wait_s": step.fwd_wait, "backward_wait_s": step.bwd_wait,
                          "eligible_bytes": step.eligible, "offloaded_bytes": step.offloaded}
        if None in (self.d2h_rate, self.h2d_rate, self.fwd_s, self.bwd_s):
            return
        hide = AUTO_MARGIN * min(self.d2h_rate * self.fwd_s, self.h2d_rate * self.bwd_s)
        self.target_bytes = int(min(hide, step.eligible or hide))

    def _auto_window(self):
        """As much as the copies lag when the target's bytes go first, at least two tensors."""
        base = 2 * self._largest
        total, x = self._last_total, self.target_bytes
        if self.budget != "auto" or not total or x is None:
            return base
        # Saved at total / fwd bytes/s, written at x / fwd: the lag peaks at x - x^2 / total.
        return max(base, int(x - x * x / total))

    # ---- what goes ----

    def _allowed(self, nbytes):
        b = self.budget
        if b is None:
            return True
        if b == "auto":
            if self.target_bytes is None:
                return True   # learning: everything goes
            return self.offloaded_bytes + nbytes <= self.target_bytes
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
        return _nbytes(t) >= self.min_bytes

    def _stream(self, device, kind):
        if device.type != "cuda":
            return None
        key = (device.index, kind)
        s = self._streams.get(key)
        if s is None:
            s = torch.cuda.Stream(device=device)
            self._streams[key] = s
        return s

    # ---- forward: save ----

    def _pack(self, t):
        nbytes = _nbytes(t) if isinstance(t, torch.Tensor) else 0
        if not self._eligible(t):
            self.kept_bytes += nbytes
            return t
        hit = self._seen.get(id(t))
        if hit is not None and hit[0]() is t:
            with hit[1].lock:
                hit[1].uses += 1
            return hit[1]   # saved twice: one file
        step = self._step
        self.eligible_bytes += nbytes
        self._largest = max(self._largest, nbytes)
        if not self._allowed(nbytes):
            self.kept_bytes += nbytes
            return _Kept(t, step, nbytes)
        self._wait_window(nbytes, step)
        ready = None
        if t.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(t.device))
        if step.device is None or step.device != t.device:
            step.device = self._device = t.device
        h = _Saved(self, step, len(step.handles), t, ready)
        step.handles.append(weakref.ref(h))
        step.largest = max(step.largest, nbytes)
        self.offloaded_bytes += nbytes
        self.offloaded_tensors += 1
        with self._lock:
            self._pending += nbytes
        self._writer.submit(self._write, h)
        try:
            self._seen[id(t)] = (weakref.ref(t), h)
        except TypeError:
            pass
        return h

    def _wait_window(self, nbytes, step):
        """Wait until nbytes more fit the window of bytes saved and not yet written."""
        window = self.window if self.window is not None else self._auto_window()
        with self._lock:
            if self._pending == 0 or self._pending + nbytes <= window:
                return
            t0 = time.perf_counter()
            while self._pending and self._pending + nbytes > window:
                self._lock.wait()
            step.fwd_wait += time.perf_counter() - t0

    def _written(self, h):
        """h's tensor is no longer waiting for its write (done, failed or kept)."""
        with self._lock:
            self._pending -= h.nbytes
            self._lock.notify_all()

    def _write(self, h):
        with h.lock:
            if h.state != QUEUED:
                return   # kept: backward took it before its write began
            h.state = WRITING
            t, ready, h.ready = h.t, h.ready, None
        try:
            # The file's create counts in the rate, unless it hid behind the compute.
            t0 = time.perf_counter()
            path = os.path.join(self.folder, f"act-{os.getpid()}-{next(self._seq)}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with h.lock:
                h.path, h.fd = path, fd
            with self._lock:
                self.files_live += 1
                self.files_created += 1
            if ready is not None:
                ready.synchronize()   # computed: from here on the time is the copy's
                t0 = time.perf_counter()
            stream = self._stream(t.device, "write")
            if stream is not None:
                # tfs_gpu_write returns once the copy is done: t may go after it
                with torch.cuda.stream(stream):
                    _io(True, fd, h.nbytes, t.data_ptr(), stream.cuda_stream)
            else:
                _io(True, fd, h.nbytes, t.data_ptr(), None)
            with self._io_lock:
                self._copy[0] += h.nbytes
                self._copy[1] += time.perf_counter() - t0
            with h.lock:
                h.state = WRITTEN
                if not h.want:
                    h.t = None   # the tensor's memory goes back now
        except Exception as e:   # the tensor stays in memory: backward still gets it
            with h.lock:
                h.state = FAILED
            self.write_errors += 1
            if self.write_errors == 1:
                warnings.warn(f"tensorfs_offload: a write failed, the tensor stays in memory: {e}")
        finally:
            del t
            self._written(h)
            if h.want:
                self._reader.submit(self._load, h)

    # ---- backward: read back ----

    def _issue(self, h):
        """Start bringing h back: a read, or keeping the tensor it still has."""
        with self._lock, h.lock:
            if h.issued:
                return
            h.issued = True
            h.step.ahead += h.nbytes
            state = h.state
            if state == QUEUED:     # its write never began: keep the tensor, no read
                h.state = KEPT
                h.ready = None
            elif state == WRITING:
                h.want = True       # the writer keeps the tensor, then hands it on
        if state == QUEUED:
            self._written(h)
            h.loaded.set()
        elif state != WRITING:
            self._reader.submit(self._load, h)

    def _load(self, h):
        """Reader: make h.t the tensor (it may have it still), and delete the file."""
        try:
            with h.lock:
                have = h.t is not None
            if not have:
                t0 = time.perf_counter()
                stream = self._stream(h.device, "read")
                if stream is not None:
                    # allocated on the read stream; _unpack records its use on backward's
                    with torch.cuda.stream(stream):
                        t = torch.empty(h.shape, dtype=h.dtype, device=h.device)
                        _io(False, h.fd, h.nbytes, t.data_ptr(), stream.cuda_stream)
                else:
                    t = torch.empty(h.shape, dtype=h.dtype, device=h.device)
                    _io(False, h.fd, h.nbytes, t.data_ptr(), None)
                with self._io_lock:
                    self._copy[2] += h.nbytes
                    self._copy[3] += time.perf_counter() - t0
                with h.lock:
                    h.t = t
                del t
            h.drop()
        except Exception as e:
            h.error = e
        finally:
            h.loaded.set()

    def _read_ahead(self, step):
        """Issue reads down the step while they stay within their bytes."""
        base = self.read_ahead
        if base is None:
            base = (self.prefetch if self.prefetch is not None else 2) * step.largest
        with self._lock:
            if step.cursor is None:
                step.cursor = len(step.handles) - 1
                step.bwd[0] = self._clock(step)
            while step.cursor >= 0 and step.ahead < base + step.credit:
                h = step.handles[step.cursor]()
                step.cursor -= 1
                if h is not None:
                    self._issue(h)

    def _unpack(self, h):
        if isinstance(h, _Kept):
            step = h.step
            with self._lock:
                step.credit += h.nbytes
            self._read_ahead(step)
            return h.t
        if not isinstance(h, _Saved):
            return h
        step = h.step
        self._issue(h)
        self._read_ahead(step)
        if not h.loaded.is_set():
            t0 = time.perf_counter()
            h.loaded.wait()
            with self._lock:
                step.bwd_wait += time.perf_counter() - t0
        with h.lock:
            if h.error is not None:
                raise RuntimeError(f"tensorfs_offload: reading back a saved tensor: {h.error}")
            if h.uses <= 0 or h.t is None:
                raise RuntimeError("tensorfs_offload: a saved tensor was read twice "
                                   "(backward with retain_graph is not supported)")
            h.uses -= 1
            t = h.t
            if h.uses == 0:
                h.t = None   # backward holds it now, and frees it after use
                last = True
            else:
                last = False
        if last:
            with self._lock:
                step.ahead -= h.nbytes
                step.bwd[1] = self._clock(step)
        if t.device.type == "cuda":
            # allocated on the read stream, used on this one
            t.record_stream(torch.cuda.current_stream(t.device))
        return t
