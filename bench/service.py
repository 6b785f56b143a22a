"""Benchmark of the env service: remote envs over loopback HTTP against the same envs in-process.

    python bench/service.py                       # FrozenLake + Sokoban, 1/8/32 clients, 3 repeats
    python bench/service.py --envs frozenlake --clients 8 --repeats 5 --workers 2
    python bench/service.py --envs frozenlake --clients 8 --image-size 256 --images png,raw --breakdown \
        --vagen-src /tmp/vagen_src --vagen-deps /tmp/vagen_deps   # issue 19: 256 px, codecs, VAGEN side by side

For each env and each number of concurrent clients it starts ``vagent serve-env`` on a free
loopback port and runs ``clients`` client threads (spread over up to ``--client-procs``
processes) that together play ``--episodes`` episodes (a fixed number per configuration, split
evenly; at least one per env) with image observations:

- ``single``: one RemoteEnv per client, one HTTP request per step;
- ``batch``: a RemoteEnvPool of ``--batch`` envs per client, one batch request per step of all.

A policy of seeded random actions (format ``no_think``) plays every episode until it ends. It
prints, as the median of ``--repeats`` runs: env steps/s, p50/p99 latency of one call (a step or
a batch step), the ratio to the same envs stepped in-process by one thread (measured in the same
run) and the server's RSS (front and worker processes): at the start, the peak, and after each
round once its sessions closed (no growth after sessions close: the per-round values stay flat).
A last section opens and closes ``--churn`` x 64 sessions and prints the server's RSS every 640
sessions (a per-session leak would grow it linearly). Loopback only; every loop is bounded by
episode counts; the server is stopped at the end. The configurations of one client count share
one server (and VAGEN's its own) and take turns round by round, so load from other processes on
the machine falls on all of them alike.

``--image-size`` sets the envs' image side; ``--images`` lists the image codecs the clients ask
for (``png``: what every client used before issue 19; ``raw``: what ``images="auto"`` picks on
loopback; ``zlib``), each measured in the same run. ``--breakdown`` prints where one step's
time goes at that image size (env step, PNG / raw / zlib encode and decode, VAGEN-style base64 in
JSON, one empty HTTP round trip). ``--vagen-src DIR`` (a checkout of VAGEN's ``vagen`` package,
e.g. ``git archive HEAD vagen | tar -x -C DIR``) with ``--vagen-deps DIR`` (``pip install --target
DIR flask``) also runs VAGEN's own service on the same machine: its Flask ``BatchEnvServer`` and
``BatchEnvClient`` with its FrozenLake (256 px: 64 px gym tiles), base64 PNG images in JSON, the
same clients and policy (VAGEN's LLM-judge, hydra and Sokoban modules are stubbed: unused here).
``--baseline-src DIR`` (a checkout of an older vagent) runs that version's server and clients
too (modes ``base-single``/``base-batch``): a before/after in one run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


def reply(rng: random.Random, actions: tuple[str, ...]) -> str:
    return f"<answer>{rng.choice(actions)}</answer>"


IMAGE_SIZE = 96  # set by --image-size (client processes get it through their arguments)
ACTIONS = ("Left", "Down", "Right", "Up")
VAGEN_MAX_STEPS = 20  # VAGEN's FrozenLake has no step limit: its clients reset after 20 steps, as ours truncate


def env_config(name: str, image_size: int | None = None) -> dict:
    return {"format": "no_think", "render": "vision", "image_size": image_size or IMAGE_SIZE}


# ------------------------------------------------------------------------------ client side


def _open(url: str, env: str, mode: str, batch: int, codec: str, image_size: int) -> object:
    from vagent.service import RemoteEnv, RemoteEnvPool

    if mode.startswith("vagen"):
        return _VagenHandle(url, batch if mode == "vagen-batch" else 1)
    cfg = env_config(env, image_size)
    if mode.startswith("base-"):  # an older vagent (--baseline-src) whose clients had no image codecs
        return RemoteEnv(url, env, **cfg) if mode == "base-single" else RemoteEnvPool(url, env, batch, **cfg)
    if mode == "single":
        return RemoteEnv(url, env, images=codec, **cfg)
    return RemoteEnvPool(url, env, batch, images=codec, **cfg)


class _VagenHandle:
    """``n`` FrozenLake envs of VAGEN's service through its own ``BatchEnvClient`` (one request per
    batch step, images as base64 PNG in JSON, decoded to PIL by its ``deserialize_observation``)."""

    def __init__(self, url: str, n: int) -> None:
        from vagen.server.client import BatchEnvClient

        self.client = BatchEnvClient(url, timeout=600, max_workers=1)
        self.ids = [f"e{os.getpid()}-{id(self)}-{i}" for i in range(n)]
        cfg = {"env_name": "frozenlake", "env_config": {"render_mode": "vision", "prompt_format": "no_think"}}
        self.client.create_environments_batch({i: cfg for i in self.ids})

    def play(self, episodes: int, rng: random.Random, seed0: int, lat: list[float]) -> int:
        steps = 0
        for ep in range(episodes):
            out = self.client.reset_batch({e: seed0 + ep * len(self.ids) + k for k, e in enumerate(self.ids)})
            obs, info = out[self.ids[0]]
            images = (obs.get("multi_modal_data") or {}).get("<image>") or []
            if not images or images[0].size != (256, 256):  # VAGEN's service answers env errors as {"error"}
                raise RuntimeError(f"VAGEN's FrozenLake gave no 256 px image: {str(info)[:300]}")
            live = list(self.ids)
            for _ in range(VAGEN_MAX_STEPS):
                if not live:
                    break
                t = time.perf_counter()
                out = self.client.step_batch({e: reply(rng, ACTIONS) for e in live})
                lat.append(time.perf_counter() - t)
                steps += len(live)
                live = [e for e in live if not out[e][2]]
        return steps

    def close(self) -> None:
        self.client.close_batch(self.ids)


def _play(handle: object, mode: str, batch: int, episodes: int, seed0: int) -> tuple[int, list[float]]:
    """Play ``episodes`` episodes (per env); returns (env steps, per-call latencies in s)."""
    from vagent.service import step_many

    rng = random.Random(seed0)
    lat: list[float] = []
    steps = 0
    if mode.startswith("vagen"):
        return handle.play(episodes, rng, seed0, lat), lat
    if mode in ("single", "base-single"):
        e = handle
        for ep in range(episodes):
            e.reset(seed0 + ep)
            while True:
                t = time.perf_counter()
                r = e.step(reply(rng, e.action_names))
                lat.append(time.perf_counter() - t)
                steps += 1
                if r.terminated or r.truncated:
                    break
        return steps, lat
    pool = handle
    names = pool[0].action_names
    for ep in range(episodes):
        pool.reset([seed0 + ep * batch + i for i in range(batch)])
        live = list(range(batch))
        while live:
            envs = [pool[i] for i in live]
            t = time.perf_counter()
            res = step_many(envs, [reply(rng, names) for _ in live])
            lat.append(time.perf_counter() - t)
            steps += len(live)
            live = [i for i, r in zip(live, res) if not (r.terminated or r.truncated)]
    return steps, lat


def _client_proc(args: tuple, n_threads: int, ready: mp.Queue, start: mp.Event, out: mp.Queue) -> None:
    url, env, mode, batch, episodes, seed0, codec, image_size, extra_path = args
    sys.path[:0] = extra_path
    handles = [_open(url, env, mode, batch, codec, image_size) for _ in range(n_threads)]
    results: list = [None] * n_threads

    def run(i: int) -> None:
        start.wait()
        t0 = time.time()
        steps, lat = _play(handles[i], mode, batch, episodes, seed0 + 100_000 * i)
        results[i] = (steps, lat, t0, time.time())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    ready.put(1)
    for t in threads:
        t.join()
    for h in handles:
        h.close()
    out.put(results)


def run_clients(url: str, env: str, mode: str, clients: int, batch: int, episodes: int, procs: int,
                codec: str = "png", extra_path: tuple[str, ...] = ()) -> dict:
    """Run ``clients`` clients over ``min(procs, clients)`` processes; aggregate the figures."""
    ctx = mp.get_context("spawn")
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    n_procs = max(1, min(procs, clients))
    per = [clients // n_procs + (1 if i < clients % n_procs else 0) for i in range(n_procs)]
    ps = [ctx.Process(target=_client_proc, args=((url, env, mode, batch, episodes, 1_000_000 * (p + 1), codec, IMAGE_SIZE,
                                                  extra_path), n, ready, start, out))
          for p, n in enumerate(per)]
    for p in ps:
        p.start()
    for _ in ps:  # every client has imported and opened its sessions before the clock starts
        ready.get(timeout=120)
    start.set()
    try:
        rows = [r for _ in ps for r in out.get(timeout=600)]
    finally:
        for p in ps:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    steps = sum(r[0] for r in rows)
    lat = sorted(x for r in rows for x in r[1])
    wall = max(r[3] for r in rows) - min(r[2] for r in rows)
    return {"steps": steps, "steps_per_s": steps / wall, "p50_ms": 1000 * lat[len(lat) // 2],
            "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]}


def in_process(env: str, episodes: int) -> float:
    """Steps/s of ``episodes`` episodes of the same envs and policy stepped in this process, one thread."""
    from vagent.envs import make

    e = make(env, **env_config(env))
    rng = random.Random(0)
    steps, t0 = 0, time.perf_counter()
    for ep in range(episodes):
        e.reset(ep)
        while True:
            steps += 1
            r = e.step(reply(rng, e.action_names))
            if r.terminated or r.truncated:
                break
    return steps / (time.perf_counter() - t0)


# ------------------------------------------------------------------------------ the server


#: VAGEN's own service, started as VAGEN's server main does (Flask dev server, threaded), with the
#: modules it imports but this benchmark never calls replaced by stubs: the LLM judge (wandb,
#: together), hydra's decorator, and its Sokoban (gym_sokoban); argv: src dir, deps dir, port
VAGEN_LAUNCHER = """
import sys, types
sys.path[:0] = [sys.argv[2], sys.argv[1]]
def stub(name, **attrs):
    m = types.ModuleType(name); m.__dict__.update(attrs); sys.modules[name] = m
class _Unused:
    pass
stub("hydra", main=lambda **k: (lambda f: f)); stub("hydra.core"); stub("hydra.core.global_hydra", GlobalHydra=_Unused)
stub("omegaconf", DictConfig=dict, OmegaConf=_Unused)
stub("vagen.server.llm_as_judge", run_llm_judge=None, wandb_run_context=None)
stub("vagen.server.llm_as_judge_sokoban_frozenlake", run_llm_judge=None)
stub("vagen.env.sokoban", SokobanEnv=_Unused, SokobanEnvConfig=_Unused, SokobanService=_Unused, SokobanServiceConfig=_Unused)
stub("gym", logger=types.SimpleNamespace(set_level=lambda level: None, ERROR=40, INFO=20))  # only to silence gym's log
import logging; logging.getLogger("werkzeug").setLevel(logging.ERROR)
from vagen.server.server import BatchEnvServer
class Cfg(dict):
    __getattr__ = dict.__getitem__
cfg = Cfg(server=Cfg(host="127.0.0.1", port=int(sys.argv[3]), debug=False), frozenlake=Cfg(max_workers=48))
BatchEnvServer(cfg).start(background=False)
"""


class Server:
    def __init__(self, workers: int, vagen: tuple[str, str] | None = None, src: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if vagen is not None:
            cmd = [sys.executable, "-c", VAGEN_LAUNCHER, vagen[0], vagen[1], str(self.port)]
        else:
            cmd = [sys.executable, "-m", "vagent.service.server", "--port", str(self.port), "--workers", str(workers),
                   "--max-sessions", "4096"]
        env = {**os.environ, "PYTHONPATH": src} if src else None
        self.proc = subprocess.Popen(cmd, cwd=src or ROOT, stdout=subprocess.DEVNULL, env=env)
        import httpx

        for _ in range(1200):
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the server exited with {self.proc.returncode}: {cmd[:3]}")
                time.sleep(0.05)
        else:
            raise RuntimeError("the server did not start")
        self.pids = [self.proc.pid] + httpx.get(self.url + "/health").json().get("worker_pids", [])

    def rss(self) -> float:
        return sum(rss_mb(p) for p in self.pids)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class _Watched:
    """A server and its RSS: at the start, sampled every 0.2 s (the peak), and after each round."""

    def __init__(self, server: Server) -> None:
        self.server, self.start, self.rounds = server, server.rss(), []
        self.peak, self.stop_ = [self.start], threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stop_.is_set():
            self.peak.append(self.server.rss())
            time.sleep(0.2)

    def close(self) -> dict:
        self.stop_.set()
        self.thread.join()
        self.server.stop()
        return {"start": round(self.start, 1), "peak": round(max(self.peak), 1),
                "after_each_round": [round(x, 1) for x in self.rounds]}


def bench_env(env: str, args: argparse.Namespace) -> list[dict]:
    """Every configuration (mode x image codec, and VAGEN's service) for each client count; the
    rounds interleave the configurations (round 1 of each, then round 2 of each, ...) so that load
    from other processes on the machine falls on all of them alike; medians over the rounds."""
    rows = []
    base = statistics.median(in_process(env, args.episodes) for _ in range(args.repeats))
    print(f"\n## {env} at {IMAGE_SIZE} px: in-process (one thread) {base:,.0f} steps/s", flush=True)
    print(f"{'mode':>12} {'images':>9} {'clients':>7} {'steps/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'x in-proc':>9} "
          f"  RSS MB: start / peak / after each round")
    plan = [(m, c) for m in args.modes for c in args.images]
    if args.baseline_src:
        plan = [(f"base-{m}", "png") for m in args.modes] + plan
    if args.vagen_src and env == "frozenlake":
        plan += [(f"vagen-{m}", "b64-json") for m in args.modes]
    kind = lambda mode: "vagen" if mode.startswith("vagen") else "base" if mode.startswith("base-") else "vagent"  # noqa: E731
    for clients in args.clients:
        servers = {"vagent": _Watched(Server(args.workers))}
        if args.baseline_src:
            servers["base"] = _Watched(Server(args.workers, src=args.baseline_src))
        if any(m.startswith("vagen") for m, _ in plan):
            servers["vagen"] = _Watched(Server(1, (args.vagen_src, args.vagen_deps)))
        samples: dict[tuple[str, str], list[dict]] = {cfg: [] for cfg in plan}
        try:
            for _ in range(args.repeats):
                for mode, codec in plan:
                    w = servers[kind(mode)]
                    batched = mode.endswith("batch")
                    extra = {"vagen": (args.vagen_src, args.vagen_deps), "base": (args.baseline_src,)}.get(kind(mode), ())
                    per_env = max(1, args.episodes // (clients * (args.batch if batched else 1)))
                    samples[(mode, codec)].append(run_clients(w.server.url, env, mode, clients, args.batch, per_env,
                                                              args.client_procs, codec, extra))
                for w in servers.values():
                    w.rounds.append(w.server.rss())
        finally:
            rss = {k: w.close() for k, w in servers.items()}
        for mode, codec in plan:
            got = samples[(mode, codec)]
            med = {k: statistics.median(s[k] for s in got) for k in ("steps_per_s", "p50_ms", "p99_ms")}
            vagen = mode.startswith("vagen")
            row = {"env": env, "mode": mode, "images": codec, "image_size": IMAGE_SIZE, "clients": clients,
                   "batch": args.batch if mode.endswith("batch") else 1, "workers": 1 if vagen else args.workers,
                   **{k: round(v, 2) for k, v in med.items()}, "rounds_steps_per_s": [round(s["steps_per_s"], 1) for s in got],
                   "in_process_steps_per_s": round(base, 1), "ratio_to_in_process": round(med["steps_per_s"] / base, 3),
                   "rss_mb": rss[kind(mode)]}
            rows.append(row)
            r = row["rss_mb"]
            print(f"{mode:>12} {codec:>9} {clients:>7} {med['steps_per_s']:>9,.0f} {med['p50_ms']:>7.2f} {med['p99_ms']:>7.2f} "
                  f"{row['ratio_to_in_process']:>9.3f}   {r['start']:.0f} / {r['peak']:.0f} / "
                  + " ".join(f"{x:.0f}" for x in r["after_each_round"]), flush=True)
    return rows


def _ms(fn, n: int = 200) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e3


def breakdown(args: argparse.Namespace) -> dict:
    """Milliseconds per call of each piece of one step's work on one FrozenLake image (this process)."""
    import base64

    import httpx

    from vagent.envs import make
    from vagent.service.protocol import decode_image, encode_image

    e = make("frozenlake", **env_config("frozenlake"))
    obs, _ = e.reset(0)
    im = obs.images[0]
    i = [0]

    def step() -> None:
        i[0] += 1
        r = e.step(f"<answer>{ACTIONS[i[0] % 4]}</answer>")
        if r.terminated or r.truncated:
            e.reset(i[0])

    out = {"env step (render included)": _ms(step)}
    for codec in ("png", "raw", "zlib"):
        part, fmt = encode_image(im, codec)
        out[f"{codec} encode ({len(part):,} B)"] = _ms(lambda: encode_image(im, codec))
        out[f"{codec} decode"] = _ms(lambda: decode_image(part, fmt))
    png, _ = encode_image(im, "png")
    out["VAGEN: base64 + JSON encode"] = _ms(lambda: json.dumps({"image": base64.b64encode(png).decode()}))
    blob = json.dumps({"image": base64.b64encode(png).decode()})
    out["VAGEN: JSON + base64 decode"] = _ms(lambda: base64.b64decode(json.loads(blob)["image"]))
    server = Server(1)
    try:
        with httpx.Client() as c:
            out["HTTP round trip (GET /health)"] = _ms(lambda: c.get(server.url + "/health"), 300)
    finally:
        server.stop()
    print(f"\n## where one step's time goes ({IMAGE_SIZE} px FrozenLake image, ms per call, one thread)")
    for k, v in out.items():
        print(f"{k:>34}: {v:7.3f}")
    return {k: round(v, 4) for k, v in out.items()}


def churn(rounds: int, workers: int) -> list[float]:
    """Server RSS (MB) after every 10 rounds of: open 64 FrozenLake sessions, reset, step, close."""
    from vagent.service import RemoteEnvPool

    server, out = Server(workers), []
    try:
        for r in range(rounds):
            with RemoteEnvPool(server.url, "frozenlake", 64, format="no_think") as pool:
                pool.reset(list(range(r * 64, r * 64 + 64)))
                pool.step(["<answer>Left</answer>"] * 64)
            if r % 10 == 9:
                out.append(round(server.rss(), 1))
    finally:
        server.stop()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--envs", default="frozenlake,sokoban")
    p.add_argument("--clients", default="1,8,32")
    p.add_argument("--modes", default="single,batch")
    p.add_argument("--batch", type=int, default=8, help="envs per client in batch mode")
    p.add_argument("--episodes", type=int, default=192, help="episodes per configuration, split over the clients")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=1, help="server --workers")
    p.add_argument("--client-procs", type=int, default=2, help="processes the client threads are spread over")
    p.add_argument("--churn", type=int, default=60, help="rounds of 64 sessions opened and closed (0: skip)")
    p.add_argument("--json", default="", help="write the rows to this JSON file")
    p.add_argument("--image-size", type=int, default=96, help="image side of the envs in pixels (default 96)")
    p.add_argument("--images", default="png,raw", help="image codecs the clients ask for, each measured (png,raw,zlib)")
    p.add_argument("--breakdown", action="store_true", help="print where one step's time goes at --image-size")
    p.add_argument("--vagen-src", default="", help="a directory holding VAGEN's vagen package: also run VAGEN's service")
    p.add_argument("--vagen-deps", default="", help="a directory with flask installed (pip install --target DIR flask)")
    p.add_argument("--baseline-src", default="", help="a checkout of an older vagent (e.g. `git worktree add DIR "
                   "d4ade06`): also run its server and clients (modes base-*), interleaved with this one")
    args = p.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    args.modes = [m for m in args.modes.split(",") if m]
    args.images = [c for c in args.images.split(",") if c]
    global IMAGE_SIZE
    IMAGE_SIZE = args.image_size
    from vagent.envs import env_class

    rows = []
    print(f"vagent service bench: {os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f}), server --workers "
          f"{args.workers}, {args.episodes} episodes per configuration, median of {args.repeats}, images "
          f"{IMAGE_SIZE} px")
    if args.breakdown:
        rows.append({"breakdown_ms": breakdown(args)})
    for env in args.envs.split(","):
        try:
            env_class(env)
        except (KeyError, ImportError, AttributeError) as exc:
            print(f"\n## {env}: skipped ({exc})")
            continue
        rows += bench_env(env, args)
    if args.churn:
        rss = churn(args.churn, args.workers)
        print(f"\n## session churn: server RSS MB after every 640 sessions opened and closed: {rss}")
        rows.append({"churn_rss_mb_every_640_sessions": rss})
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
