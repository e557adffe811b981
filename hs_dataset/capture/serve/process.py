"""A started SGLang server: its own process group, health wait, log tail and stop."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

from hs_dataset.capture.serve.errors import ServeError
from hs_dataset.capture.serve.plan import ServerPlan
from hs_dataset.server_patch.contract.private_dir import ensure_private_dir

__all__ = ["ServerProcess", "launch"]


class ServerProcess:
    """A started server (its own process group); :meth:`stop` ends the group."""

    def __init__(self, plan: ServerPlan, proc: subprocess.Popen, log_path: str | None) -> None:
        self.plan = plan
        self.proc = proc
        self.log_path = log_path
        self.url = plan.url
        self.staging_dir = plan.staging_dir
        self.started_in_s: float | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - chars))
            return f.read().decode(errors="replace")

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                # children of the group may outlive the leader briefly
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def launch(plan: ServerPlan, *, log_path: str | None = None, timeout: float | None = None) -> ServerProcess:
    """Start the server, wait for ``/health``; raise :class:`ServeError` with the log tail if it dies."""
    ensure_private_dir(plan.staging_dir)
    if _http_ok(plan.url + "/health", timeout=1.0):
        raise ServeError(f"something already answers at {plan.url}; choose another --port")
    env = dict(os.environ)
    env.update(plan.env)
    out = open(log_path, "ab") if log_path else None
    try:
        proc = subprocess.Popen(
            [plan.python, *plan.argv],
            env=env,
            stdout=out if out else None,
            stderr=subprocess.STDOUT if out else None,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        if out:
            out.close()
    server = ServerProcess(plan, proc, log_path)
    start = time.monotonic()
    deadline = start + (timeout if timeout is not None else plan.startup_timeout_s)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServeError(
                f"the SGLang server exited with code {proc.returncode} before becoming healthy"
                + (f"; last log lines:\n{server.log_tail()}" if log_path else "")
            )
        if _http_ok(plan.url + "/health"):
            server.started_in_s = time.monotonic() - start
            return server
        time.sleep(0.5)
    server.stop()
    raise ServeError(
        f"the SGLang server did not become healthy within {deadline - start:.0f} s"
        + (f"; last log lines:\n{server.log_tail()}" if log_path else "")
    )
