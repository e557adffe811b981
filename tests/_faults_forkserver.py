"""Fork server for the kill-chain tests (tests/test_faults_kill.py).

A fresh ``hs-dataset`` process spends ~10-15 s importing torch/transformers and
loading the tiny model before it writes a byte, so a chain of 25 SIGKILLed builds
would take minutes. This helper pays that once, then forks one child per request;
each child runs the real command line (``hs_dataset.cli.main.main(argv)``, i.e. exactly
what the ``hs-dataset`` script runs) and is killed with SIGKILL either by a crash
point of :mod:`hs_dataset.faults` (armed in the child after the fork, as
``HS_DATASET_CRASH_AT`` would) or by this server at a random moment after the child
has started writing.

Torch runs single-threaded here (``torch.set_num_threads(1)`` before any op): forking a
process whose OpenMP pool already ran is unsafe, and the uninterrupted reference
build is made the same way, so the comparison is exact.

Protocol, one JSON object per line:

* stdin request: ``{"argv": [...], "crash": "point:n" | null, "kill_after_call": "mod.Class.method" | null, "log": path,
  "kill_after_progress": {"dir": path, "delay_s": float} | null, "timeout_s": float}``
* stdout: ``{"ready": true, "warmup_s": ...}`` once, then per request
  ``{"pid": int, "returncode": int, "killed_by": "crash_point" | "random" | "timeout" | null, "elapsed_s": float}``
  where ``returncode`` follows subprocess's convention (``-9`` = SIGKILL).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.pop("HS_DATASET_CRASH_AT", None)

import torch  # noqa: E402

torch.set_num_threads(1)

from hs_dataset import faults  # noqa: E402
from hs_dataset.config import load_card  # noqa: E402
from hs_dataset.cli.main import main as cli_main  # noqa: E402
from hs_dataset.pipeline import make_backend  # noqa: E402


def _warm_up() -> float:
    """Import everything a build/export touches, and build the tiny model once (cached on disk)."""
    t0 = time.perf_counter()
    import hs_dataset.cli.export  # noqa: F401
    import hs_dataset.formats.verify  # noqa: F401
    import hs_dataset.cli.build  # noqa: F401
    from transformers import AutoTokenizer

    _cache_tokenizers(AutoTokenizer)
    backend = make_backend(load_card("tiny-deepseek-hf"), device="cpu")
    try:
        info = backend.info()
        AutoTokenizer.from_pretrained(info.model_path, local_files_only=True)
    finally:
        backend.close()
    for name in ("hs_dataset.interop.specforge", "hs_dataset.interop.speculators"):
        try:
            __import__(name)
        except ImportError:
            pass
    return time.perf_counter() - t0


def _cache_tokenizers(auto_tokenizer) -> None:
    """Load each tokenizer once here instead of once per child (~0.9 s each): a pure speed-up,
    the children get the very object ``from_pretrained`` built from the same files."""
    original = auto_tokenizer.from_pretrained
    cache: dict = {}

    def from_pretrained(*args, **kwargs):
        key = json.dumps([[str(a) for a in args], sorted((k, repr(v)) for k, v in kwargs.items())])
        if key not in cache:
            cache[key] = original(*args, **kwargs)
        return cache[key]

    auto_tokenizer.from_pretrained = from_pretrained


def _signature(directory: str) -> tuple:
    """What the child has written so far (entry names and the manifest's mtime)."""
    try:
        names = tuple(sorted(n for n in os.listdir(directory) if n != ".lock"))
    except FileNotFoundError:
        return ()
    try:
        mtime = os.stat(os.path.join(directory, "manifest.json")).st_mtime_ns
    except FileNotFoundError:
        mtime = 0
    return names, mtime


def _kill_after_call(dotted: str) -> None:
    """SIGKILL this process right after ``package.module.Class.method`` (or a function) returns.

    For places no crash point of hs_dataset.faults marks (e.g. inside a third-party call).
    """
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:-1]:
            owner = getattr(owner, name)
        break
    else:
        raise ValueError(f"cannot resolve {dotted!r}")
    original = getattr(owner, parts[-1])

    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(owner, parts[-1], wrapper)


def _child(request: dict) -> None:
    """Runs in the forked child; never returns."""
    code = 1
    try:
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout = sys.stderr  # the parent's unflushed stdout buffer must never reach the protocol pipe
        faults._remaining.clear()
        crash = request.get("crash")
        if crash:
            point, _, count = crash.partition(":")
            assert point in faults.CRASH_POINTS, point
            faults._remaining[point] = int(count or 1)
        if request.get("kill_after_call"):
            _kill_after_call(request["kill_after_call"])
        code = int(cli_main(request["argv"]) or 0)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve_one(request: dict) -> dict:
    watch = request.get("kill_after_progress")
    timeout = float(request.get("timeout_s", 300))
    sys.stdout.flush()
    start = time.perf_counter()
    before = _signature(watch["dir"]) if watch else None
    pid = os.fork()
    if pid == 0:
        _child(request)
    killed_by = None
    kill_at = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        now = time.perf_counter()
        if now - start > timeout:
            os.kill(pid, signal.SIGKILL)  # not reaped yet, so the pid is still our child
            killed_by = "timeout"
        elif watch and killed_by is None:
            if kill_at is None and _signature(watch["dir"]) != before:
                kill_at = now + float(watch["delay_s"])
            if kill_at is not None and now >= kill_at:
                os.kill(pid, signal.SIGKILL)
                killed_by = "random"
        time.sleep(0.002)
    if os.WIFSIGNALED(status):
        returncode = -os.WTERMSIG(status)
        if returncode == -signal.SIGKILL and killed_by is None:
            killed_by = "crash_point"
    else:
        returncode = os.WEXITSTATUS(status)
        if killed_by == "random":  # exited on its own just before the signal was sent
            killed_by = None
    return {"pid": pid, "returncode": returncode, "killed_by": killed_by, "elapsed_s": round(time.perf_counter() - start, 3)}


def main() -> None:
    out = sys.stdout
    print(json.dumps({"ready": True, "warmup_s": round(_warm_up(), 2)}), file=out, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        print(json.dumps(_serve_one(json.loads(line))), file=out, flush=True)


if __name__ == "__main__":
    main()
