#!/usr/bin/env python3
"""swap_tensor.py - swap a CUDA tensor out to tensorfs and back with libtensorfs-cuda.

Loads libtensorfs-cuda with ctypes, writes a random tensor from GPU memory
to a file on a tensorfs mount (tfs_gpu_write), frees it, reads it back into
fresh GPU memory (tfs_gpu_read) and checks that it is equal. Then it times
the same swap three ways, on the same mount:

  tensorfs-cuda   tfs_gpu_write / tfs_gpu_read: DMA between the GPU and the
                  daemon's DRAM arena (mount with -o cuda=on), or pread/pwrite
                  through a pinned bounce buffer elsewhere
  torch.save      torch.save(tensor, file) / torch.load(file, map_location=cuda)
  file I/O        tensor.cpu() into pinned memory, os.pwrite; os.preadv into
                  pinned memory, .cuda()

Before each read the kernel's cached pages of the file are dropped
(POSIX_FADV_DONTNEED), so that reads reach tensorfs, as an offloader's
O_DIRECT reads do.

  python3 swap_tensor.py --mount /mnt/tfs [--size-mib 256] [--dtype float16]
                         [--iters 3] [--lib /path/to/libtensorfs-cuda.so]

The library is found through --lib, $TENSORFS_CUDA_LIB, or the linker's
search path. Needs PyTorch with CUDA and a GPU.
"""
import argparse
import ctypes
import ctypes.util
import os
import sys
import time

LIB_NAMES = ("libtensorfs-cuda.so.0", "libtensorfs-cuda.so")
PATH_NAMES = {0: "fallback (pread/pwrite + bounce buffer)", 1: "zero-copy (shared DRAM arena)"}


def load_lib(path):
    """Open libtensorfs-cuda and declare the calls we use."""
    candidates = [path] if path else [os.environ.get("TENSORFS_CUDA_LIB"),
                                      ctypes.util.find_library("tensorfs-cuda"), *LIB_NAMES]
    errors = []
    for name in candidates:
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError as e:
            errors.append(f"{name}: {e}")
    else:
        sys.exit("swap_tensor.py: cannot load libtensorfs-cuda (give --lib or set "
                 "TENSORFS_CUDA_LIB):\n  " + "\n  ".join(errors))
    io_args = [ctypes.c_int, ctypes.c_longlong, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    lib.tfs_gpu_read.argtypes = io_args
    lib.tfs_gpu_read.restype = ctypes.c_ssize_t
    lib.tfs_gpu_write.argtypes = io_args
    lib.tfs_gpu_write.restype = ctypes.c_ssize_t
    lib.tfs_gpu_path.argtypes = [ctypes.c_int]
    lib.tfs_gpu_path.restype = ctypes.c_int
    lib.tfs_gpu_error.argtypes = []
    lib.tfs_gpu_error.restype = ctypes.c_char_p
    return lib


def check(lib, what, ret, want):
    if ret != want:
        msg = lib.tfs_gpu_error().decode(errors="replace")
        sys.exit(f"swap_tensor.py: {what} returned {ret}, want {want}: {msg}")


def drop_cache(fd):
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def swap_tfs(lib, torch, path, t):
    """Out with tfs_gpu_write, in with tfs_gpu_read; returns (tensor, out s, in s)."""
    nbytes = t.numel() * t.element_size()
    stream = torch.cuda.current_stream().cuda_stream
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        check(lib, "tfs_gpu_write", lib.tfs_gpu_write(fd, 0, nbytes, t.data_ptr(), stream), nbytes)
        t1 = time.perf_counter()
        back = torch.empty_like(t)
        drop_cache(fd)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        check(lib, "tfs_gpu_read", lib.tfs_gpu_read(fd, 0, nbytes, back.data_ptr(), stream), nbytes)
        t3 = time.perf_counter()
    finally:
        os.close(fd)
    return back, t1 - t0, t3 - t2


def swap_torch_save(torch, path, t):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.save(t, path)
    t1 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    drop_cache(fd)
    os.close(fd)
    t2 = time.perf_counter()
    back = torch.load(path, map_location="cuda")
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    return back, t1 - t0, t3 - t2


def host_view(host):
    """A writable memoryview of a pinned CPU tensor's bytes."""
    nbytes = host.numel() * host.element_size()
    return memoryview((ctypes.c_char * nbytes).from_address(host.data_ptr())).cast("B")


def swap_file_io(torch, path, t):
    nbytes = t.numel() * t.element_size()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    host.copy_(t)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view, done = host_view(host), 0
        while done < nbytes:
            done += os.pwrite(fd, view[done:], done)
        t1 = time.perf_counter()
        drop_cache(fd)
        t2 = time.perf_counter()
        done = 0
        while done < nbytes:
            n = os.preadv(fd, [view[done:]], done)
            if n <= 0:
                sys.exit(f"swap_tensor.py: short read of {path} at {done}")
            done += n
        back = host.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
    finally:
        os.close(fd)
    return back, t1 - t0, t3 - t2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mount", required=True, help="a tensorfs mount point")
    ap.add_argument("--size-mib", type=int, default=256, help="tensor size in MiB (256)")
    ap.add_argument("--dtype", default="float16", help="torch dtype (float16)")
    ap.add_argument("--iters", type=int, default=3, help="timed swaps per way; best is shown")
    ap.add_argument("--lib", help="path of libtensorfs-cuda.so")
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        print("swap_tensor.py needs PyTorch with CUDA (https://pytorch.org); "
              "it is not installed for " + sys.executable, file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("swap_tensor.py: PyTorch sees no CUDA GPU", file=sys.stderr)
        return 2
    lib = load_lib(args.lib)
    dtype = getattr(torch, args.dtype, None)
    if not isinstance(dtype, torch.dtype):
        sys.exit(f"swap_tensor.py: unknown dtype {args.dtype}")

    elem = torch.empty((), dtype=dtype).element_size()
    numel = args.size_mib * (1 << 20) // elem
    nbytes = numel * elem
    t = torch.randn(numel, device="cuda", dtype=torch.float32).to(dtype)
    ref = t.clone()
    path = os.path.join(args.mount, "swap_tensor.bin")

    # The swap itself: out, the GPU copy freed, back in, compared.
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    print(f"{path}: {PATH_NAMES.get(lib.tfs_gpu_path(fd), 'unknown')}")
    os.close(fd)
    back, _, _ = swap_tfs(lib, torch, path, t)
    del t
    torch.cuda.empty_cache()
    if not torch.equal(back, ref):
        sys.exit("swap_tensor.py: the tensor read back differs from the one written")
    print(f"swapped {nbytes >> 20} MiB of {args.dtype} out and back in: equal")
    del back

    ways = [("tensorfs-cuda", lambda p, x: swap_tfs(lib, torch, p, x)),
            ("torch.save/load", lambda p, x: swap_torch_save(torch, p, x)),
            ("file I/O", lambda p, x: swap_file_io(torch, p, x))]
    print(f"\n{'way':<16} {'out GB/s':>9} {'in GB/s':>9}   (best of {args.iters})")
    for name, swap in ways:
        best_out = best_in = float("inf")
        p = os.path.join(args.mount, "swap_" + name.split("/")[0].replace(" ", "_") + ".bin")
        for _ in range(args.iters):
            back, t_out, t_in = swap(p, ref)
            if not torch.equal(back, ref):
                sys.exit(f"swap_tensor.py: {name} read back a different tensor")
            del back
            best_out, best_in = min(best_out, t_out), min(best_in, t_in)
        os.unlink(p)
        print(f"{name:<16} {nbytes / best_out / 1e9:>9.2f} {nbytes / best_in / 1e9:>9.2f}")
    os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
