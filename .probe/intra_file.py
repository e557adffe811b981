"""Does writing one 512 MiB file with several threads (pwrite parts) beat one thread? (disk, fsync)"""
import os, sys, time, threading, statistics
import numpy as np, ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
def sfr_call(fd, a, n):
    if libc.sync_file_range(fd, a, n, 2) != 0: raise OSError(ctypes.get_errno(), "sfr")
d = sys.argv[1] if len(sys.argv) > 1 else "."
N = 512 << 20
buf = np.random.randint(0, 255, N, dtype=np.uint8)
mv = memoryview(buf)

def one(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    off = 0
    while off < N:
        off += os.write(fd, mv[off:off + (64 << 20)])
    os.fsync(fd); os.close(fd)

def chunked_sfr(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    off = 0
    while off < N:
        n = os.write(fd, mv[off:off + (64 << 20)])
        sfr_call(fd, off, n)
        off += n
    os.fsync(fd); os.close(fd)

def parts(path, k, sfr=False):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    step = N // k
    def w(i):
        a = i * step
        b = N if i == k - 1 else a + step
        o = a
        while o < b:
            o += os.pwrite(fd, mv[o:min(b, o + (64 << 20))], o)
        if sfr:
            sfr_call(fd, a, b - a)
    ts = [threading.Thread(target=w, args=(i,)) for i in range(k)]
    [t.start() for t in ts]; [t.join() for t in ts]
    os.fsync(fd); os.close(fd)

def conc(n, fn):
    """n files at once, each by fn"""
    ts = [threading.Thread(target=fn, args=(os.path.join(d, f"f{i}.bin"),)) for i in range(n)]
    t0 = time.perf_counter(); [t.start() for t in ts]; [t.join() for t in ts]
    dt = time.perf_counter() - t0
    for i in range(n): os.unlink(os.path.join(d, f"f{i}.bin"))
    return n * N / dt / 1e9

for rep in range(2):
    for name, n, fn in (
        ("1 file, 1 thread", 1, one),
        ("1 file, 8 threads pwrite", 1, lambda p: parts(p, 8)),
        ("1 file, 8 threads pwrite+sync_file_range", 1, lambda p: parts(p, 8, True)),
        ("1 file, 1 thread + sfr parts", 1, lambda p: parts(p, 1, True)),
        ("2 files, 1 thread each", 2, one),
        ("2 files, 4 threads each pwrite+sfr", 2, lambda p: parts(p, 4, True)),
        ("8 files, 1 thread each", 8, one),
        ("8 files, 1 thread each sfr", 8, lambda p: parts(p, 1, True)),
        ("1 file, 1 thread chunked sfr", 1, chunked_sfr),
        ("2 files, 1 thread each chunked sfr", 2, chunked_sfr),
        ("8 files, 1 thread each chunked sfr", 8, chunked_sfr),
    ):
        print(f"rep {rep} {name}: {conc(n, fn):.2f} GB/s", flush=True)
