"""`serve` under load (printed, not asserted): server RSS and requests/s.

64 concurrent clients (keep-alive connections; every 4th request streams) send short greedy
completions to a `serve` subprocess on 127.0.0.1. Reported per server:
- RSS after the first checkpoint (default 1,000 requests) and at the end (default 20,000):
  the goal is flat within 5% (the engine keeps nothing per finished request);
- requests/s over the whole run, new server against the one before the move to uvicorn,
  loaded from git history (`--baseline REV`, default: the last commit that had
  harness/engine/server.py), on the same load in the same run. `--baseline none` skips it.

    .venv/bin/python benchmarks/bench_server.py                     # 1,000 / 20,000 requests
    .venv/bin/python benchmarks/bench_server.py --requests 5000 --checkpoint 1000
"""
from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
OLD_PATH = "harness/engine/server.py"
sys.path.insert(0, str(ROOT))
from harness.stopping import end_process  # noqa: E402


# -- the server, in a child process ----------------------------------------------------------
def serve(which: str, src: str | None, prefix_cache: bool) -> None:
    sys.path.insert(0, str(ROOT))
    from harness.engine.config import EngineConfig
    cfg = EngineConfig(model="tiny", prefix_cache=prefix_cache)
    if which == "new":
        from harness.serve import make_server
        srv = make_server(cfg)
    else:  # the standard-library server as it was, from git history
        spec = importlib.util.spec_from_file_location("old_server", src)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["old_server"] = mod  # its dataclasses look their module up there
        spec.loader.exec_module(mod)
        srv = mod.make_server(cfg)
    print(srv.url, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


def baseline_source(rev: str | None, tmp: Path) -> Path | None:
    if rev == "none":
        return None
    if rev is None:  # the commit that removed the old server; its parent still has it
        gone = subprocess.run(["git", "rev-list", "-1", "HEAD", "--", OLD_PATH], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()
        if not gone:
            return None
        rev = f"{gone}^"
    text = subprocess.run(["git", "show", f"{rev}:{OLD_PATH}"], cwd=ROOT, capture_output=True, text=True)
    if text.returncode != 0:
        print(f"no baseline: {text.stderr.strip()}", file=sys.stderr)
        return None
    path = tmp / "old_server.py"
    path.write_text(text.stdout)
    return path


# -- the load -----------------------------------------------------------------------------------
def load(url: str, total: int, clients: int, checkpoint: int, on_checkpoint) -> dict:
    host, port = re.match(r"http://([\d.]+):(\d+)", url).groups()
    lock = threading.Lock()
    state = {"next": 0, "done": 0, "failed": 0, "fired": False}

    def client(k: int) -> None:
        c = http.client.HTTPConnection(host, int(port), timeout=120)
        while True:
            with lock:
                i = state["next"]
                if i >= total:
                    break
                state["next"] += 1
            body = {"model": "tiny", "prompt": f"client {k} request {i}: " + "ab" * (i % 7), "max_tokens": 8,
                    "temperature": 0, "stream": i % 4 == 0}
            try:
                c.request("POST", "/v1/completions", body=json.dumps(body),
                          headers={"Content-Type": "application/json"})
                r = c.getresponse()
                data = r.read()
                ok = r.status == 200 and (b"[DONE]" in data if body["stream"] else b'"choices"' in data)
            except (OSError, http.client.HTTPException):
                ok = False
                c.close()
                c = http.client.HTTPConnection(host, int(port), timeout=120)
            with lock:
                state["done"] += 1
                state["failed"] += not ok
                fire = state["done"] >= checkpoint and not state["fired"]
                state["fired"] |= fire
            if fire:
                on_checkpoint()
        c.close()

    t = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    dt = time.perf_counter() - t
    return {"seconds": dt, "rps": total / dt, "failed": state["failed"]}


class Child:
    """A server subprocess and its process handle (RSS, CPU time)."""

    def __init__(self, which: str, src: Path | None, prefix_cache: bool):
        cmd = [sys.executable, __file__, "--serve", which, str(int(prefix_cache))] + ([str(src)] if src else [])
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
        self.url = self.p.stdout.readline().strip()
        self.proc = psutil.Process(self.p.pid)
        self.done = self.failed = 0
        self.seconds = self.cpu = 0.0
        self.rss_checkpoint = self.rss_end = 0

    def cpu_s(self) -> float:
        t = self.proc.cpu_times()
        return t.user + t.system

    def rss(self) -> int:
        return self.proc.memory_info().rss

    def stop(self) -> None:
        end_process(self.p, grace=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--checkpoint", type=int, default=1_000, help="RSS is read when this many have finished")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--round", type=int, default=1_000, help="requests per server per turn")
    ap.add_argument("--baseline", default=None, help="git revision with the old server, or 'none'")
    ap.add_argument("--prefix-cache", action=argparse.BooleanOptionalAction, default=False,
                    help="the engine's prefix cache (default off: with every prompt unique its eviction, a walk "
                         "over the whole cache, costs more than the HTTP layer and varies with the cache)")
    ap.add_argument("--serve", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve[0], args.serve[2] if len(args.serve) > 2 else None, args.serve[1] == "1")
    with tempfile.TemporaryDirectory() as tmp:
        src = baseline_source(args.baseline, Path(tmp))
        servers = [("new (uvicorn + Starlette)", Child("new", None, args.prefix_cache))]
        if src is not None:
            servers.append(("old (http.server)", Child("old", src, args.prefix_cache)))
        try:
            # the servers take turns, a round each, so a machine whose load drifts (a shared
            # CI box) weighs on both alike; CPU seconds per request do not depend on it at all
            while any(c.done < args.requests for _, c in servers):
                for _, c in servers:
                    n = min(args.round, args.requests - c.done)
                    if n <= 0:
                        continue
                    if c.done < args.checkpoint <= c.done + n:  # read RSS exactly at the checkpoint
                        n = args.checkpoint - c.done
                    cpu = c.cpu_s()
                    r = load(c.url, n, args.clients, n + 1, lambda: None)
                    c.cpu += c.cpu_s() - cpu
                    c.seconds += r["seconds"]
                    c.failed += r["failed"]
                    c.done += n
                    if c.done == args.checkpoint:
                        c.rss_checkpoint = c.rss()
                    c.rss_end = c.rss()
        finally:
            for _, c in servers:
                c.stop()
    print(f"serve, tiny model, {args.clients} clients, {args.requests} requests per server (8 tokens each, "
          f"1 in 4 streamed), in turns of {args.round}, prefix cache {'on' if args.prefix_cache else 'off'}")
    print(f"{'server':26}{'RSS@' + str(args.checkpoint):>12}{'RSS@' + str(args.requests):>12}{'growth':>9}"
          f"{'req/s':>9}{'CPU ms/req':>12}{'failed':>8}")
    for name, c in servers:
        growth = c.rss_end / c.rss_checkpoint - 1 if c.rss_checkpoint else float("nan")
        print(f"{name:26}{c.rss_checkpoint / 2**20:>10.1f}MB{c.rss_end / 2**20:>10.1f}MB{growth:>+9.1%}"
              f"{c.done / c.seconds:>9.1f}{1000 * c.cpu / c.done:>12.2f}{c.failed:>8d}")
    if len(servers) == 2:
        (_, a), (_, b) = servers
        print(f"new / old: requests/s {(a.done / a.seconds) / (b.done / b.seconds):.2f}, "
              f"server CPU per request {(a.cpu / a.done) / (b.cpu / b.done):.2f}")


if __name__ == "__main__":
    main()
