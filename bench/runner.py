"""Drives one engine's worker process over the cases, with a compile timeout and a test timeout per
case: a hang or a crash is recorded and the worker is restarted, never fatal."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from bench import REPO_ROOT
from bench.worker import THREAD_ENV
from constrain.testing.corpus import Case


class WorkerDied(Exception):
    pass


class Worker:
    def __init__(self, engine: str, opts: dict[str, Any], log: TextIO) -> None:
        self.engine = engine
        self.opts = opts
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.buf = b""
        self.version = ""

    def start(self) -> None:
        cmd = [sys.executable, "-m", "bench.worker", "--engine", self.engine]
        for k, v in self.opts.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        env = {**os.environ, **THREAD_ENV, "PYTHONPATH": str(REPO_ROOT)}
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, start_new_session=True)
        self.buf = b""
        msg = self.read(600.0)
        if msg is None or not msg.get("ready"):
            err = "start timed out" if msg is None else msg.get("error", "?")
            self.kill()
            raise RuntimeError(f"{self.engine}: worker did not start: {err}")
        self.version = msg.get("version", "")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.proc = None

    def close(self) -> None:
        if self.proc is not None and self.proc.stdin:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except Exception:
                pass
        self.kill()

    def read(self, timeout: float) -> dict | None:
        """The next message, None on timeout; WorkerDied if the process ended."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self.buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if not sel.select(left):
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    self.proc.wait()
                    raise WorkerDied(f"exit code {self.proc.returncode}")
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def send(self, obj: dict) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(obj) + "\n").encode("utf-8"))
        self.proc.stdin.flush()

    def run_case(self, case: Case, compile_timeout: float, test_timeout: float) -> dict[str, Any]:
        """{"compile": {"status": ok|error|timeout|crash, "s", "error"}, plus the worker's "done" fields}."""
        if self.proc is None:
            self.start()
        rec: dict[str, Any] = {}
        try:
            self.send(case.to_json())
            msg = self.read(compile_timeout)
            if msg is None:
                self.kill()
                return {"compile": {"status": "timeout", "s": compile_timeout}}
            comp = {"status": "ok" if msg["ok"] else "error", "s": msg["s"]}
            if not msg["ok"]:
                comp["error"] = msg.get("error", "")
                return {"compile": comp}
            rec["compile"] = comp
            msg = self.read(test_timeout)
            if msg is None:
                self.kill()
                rec["test_status"] = "timeout"
                return rec
            msg.pop("phase", None)
            rec.update(msg)
            rec["test_status"] = "ok"
            return rec
        except (WorkerDied, BrokenPipeError) as e:
            self.kill()
            if "compile" not in rec:
                return {"compile": {"status": "crash", "s": None, "error": str(e)}}
            rec["test_status"] = f"crash ({e})"
            return rec


def run_engine(engine: str, cases: list[Case], opts: dict[str, Any], compile_timeout: float, test_timeout: float,
               log_path: Path, on_result: Callable[[str, Case, dict], None]) -> str:
    """Runs every case on one engine; returns the engine's version string ("" if it could not start)."""
    with open(log_path, "a", encoding="utf-8") as log:
        worker = Worker(engine, opts, log)
        try:
            worker.start()
        except RuntimeError as e:
            print(f"[{engine}] unavailable: {e}", file=sys.stderr)
            return ""
        try:
            for case in cases:
                rec = worker.run_case(case, compile_timeout, test_timeout)
                on_result(engine, case, rec)
        finally:
            worker.close()
        return worker.version
