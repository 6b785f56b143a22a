"""Seconds per weight push across a real network link (a veth between two network-namespace
"hosts", uncapped and capped with ``tc`` at 10 and 1 Gbit/s) against the loopback, in one run.

Layout (tests/multihost/cluster.py makes the hosts; needs root): a Ray cluster of three nodes,

- the head node on host0 (its ``eth0`` address), which the pushing process (the trainer's side,
  run in host0's namespace) joins: the ``same node`` place, custom resource ``push_same``;
- a second node on host0 at ``127.0.0.1``: the ``loopback`` place (``push_loop``); an object
  pushed there crosses a TCP connection over host0's ``lo``, as on the veth, but no interface;
- a node on host1: the ``veth`` place (``push_far``); what it receives leaves host0 by its
  ``eth0``, crosses the bridge and enters host1 by its ``eth0``.

For a capped link both ``eth0`` ends get a root ``tbf`` qdisc (``tc qdisc replace dev eth0 root tbf
rate R burst R/8/250 latency 50ms``), so the link is capped both ways; the loopback is never capped.

Payloads, each pushed to one receiver per place:

- ``tiny full`` / ``tiny LoRA``: the default run's tiny Qwen3-VL with LoRA r = 16 (bench/lora_push.py's
  ``tiny_policy``) in a real HF engine replica (``RemoteEngine``, one ``EngineReplica`` pinned by
  its custom resource): the whole state (``update_state``) and the adapter alone
  (``update_weights``: ``pushed_state``'s ``lora_`` tensors). The time includes the replica's
  ``load_state_dict``.
- ``3B slice``: random bf16 tensors with the names and shapes of Qwen2.5-VL-3B's language model
  (transformers' ``Qwen2_5_VLForConditionalGeneration`` built on the meta device from the 3B's
  sizes: 36 layers, hidden 2048, MLP 11008, 16 heads, 2 KV heads of 128, vocab 151936):
  ``embed_tokens`` + the first ``--layers`` layers + the final norm. The whole language model
  (6.2 GB; the tied ``lm_head`` and the vision tower left out) does not fit twice in the object
  stores and twice in the processes of a 24 GB machine, so its seconds are EXTRAPOLATED from the
  slice's (time x bytes ratio), and labelled as such.
- ``3B LoRA``: the adapter of that shape, measured whole: r = 16 on q/k/v/o/gate/up/down of all
  36 layers (``...q_proj.lora_A.default.weight`` [16, 2048], ``...lora_B.default.weight``
  [out, 16]: PEFT's names under the base model), bf16.

No model of the 3B's shape is loaded: the 3B payloads go to a minimal actor (``Sink``) on the same
node, attached as a replica (``RemoteEngine.attach``), so each push runs ``RemoteEngine``'s own
path (``update_state`` -> ``_broadcast``: ``ray.put`` once, ``load_weights.remote(ref)``, wait);
the receiver gets the state dict (pulled into its node's object store, unpickled into tensors)
and sums its bytes instead of loading it into a model.

Each figure is the median of ``--rounds`` pushes after one untimed push of the same payload.
``wire MB`` is the interface's sent bytes per push (host0's ``eth0`` for the veth, ``lo`` for the
other places; the driver's control traffic to its node also crosses ``lo``): it shows that the
bytes took the link the row names.

Run (as root; 2 GB object store per node):

    PYTHONPATH=. .venv/bin/python bench/push_link.py [--rounds 3] [--layers 4] [--rates 10gbit,1gbit]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))
PORT = 6379
OBJECT_STORE_BYTES = 2_000_000_000
#: place -> the custom resource its node offers (2 units: a replica and a Sink)
PLACES = {"same node": "push_same", "loopback": "push_loop", "veth": "push_far"}
#: Qwen2.5-VL-3B's language model (its config.json)
QWEN25_VL_3B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                    num_attention_heads=16, num_key_value_heads=2)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Row:
    """One measured push: ``payload`` to ``place`` over ``link`` (``veth`` with ``cap`` or none)."""

    payload: str
    nbytes: int
    place: str
    cap: str  # "" uncapped, else the tbf rate ("10gbit")
    seconds: float  # median over the rounds
    wire_bytes: float  # bytes the place's interface sent per push

    @property
    def link(self) -> str:
        return f"{self.place} {self.cap}".strip()

    @property
    def gbit_s(self) -> float:
        return self.nbytes * 8 / self.seconds / 1e9


# ---------------------------------------------------------------------------------------- payloads
def qwen25_vl_3b_shapes() -> dict:
    """``{name: shape}`` of Qwen2.5-VL-3B's language model as transformers names it (built on the
    meta device: no memory, no download), without the tied ``lm_head`` and the vision tower."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    rope = {"rope_type": "default", "mrope_section": [16, 24, 24], "rope_theta": 1e6}
    cfg = Qwen2_5_VLConfig(text_config=dict(QWEN25_VL_3B, tie_word_embeddings=True, rope_parameters=rope),
                           vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                                              out_hidden_size=2048), tie_word_embeddings=True)
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration._from_config(cfg, dtype=torch.bfloat16)
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if "visual" not in k and k != "lm_head.weight"}


def layer_of(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[parts.index("layers") + 1]) if "layers" in parts else None


def lora_shapes(shapes: dict, r: int) -> dict:
    """PEFT's adapter tensors (under the base model's names) for r on every LORA_TARGETS linear."""
    out = {}
    for name, shape in shapes.items():
        if name.endswith(".weight") and name.split(".")[-2] in LORA_TARGETS:
            stem = name[: -len(".weight")]
            out[f"{stem}.lora_A.default.weight"] = (r, shape[1])
            out[f"{stem}.lora_B.default.weight"] = (shape[0], r)
    return out


def random_state(shapes: dict, seed: int = 0) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return {k: torch.empty(s, dtype=torch.bfloat16).normal_(generator=gen) for k, s in shapes.items()}


def nbytes_of(shapes: dict) -> int:
    import math

    return sum(math.prod(s) * 2 for s in shapes.values())


class Sink:
    """A receiver with a replica's push interface (the body of a Ray actor): takes the state dict
    as a replica does and sums its bytes instead of loading it into a model."""

    def ready(self) -> tuple[int, bool]:
        return os.getpid(), False

    def load_weights(self, state_dict: dict, version: int) -> int:
        got = sum(t.numel() * t.element_size() for t in state_dict.values())
        if got <= 0:
            raise ValueError(f"pushed state of {len(state_dict)} tensors holds no bytes")
        return int(version)


# ------------------------------------------------------------------------------ the pushing process
def sent_bytes(interface: str) -> int:
    return int(Path(f"/sys/class/net/{interface}/statistics/tx_bytes").read_text())


def cap_link(netns_far: str, rate: str | None) -> None:
    """tbf at ``rate`` on both ends' eth0 (this namespace's and ``netns_far``'s); None removes it."""
    for prefix in ([], ["ip", "netns", "exec", netns_far]):
        if rate is None:
            subprocess.run([*prefix, "tc", "qdisc", "del", "dev", "eth0", "root"], capture_output=True)
            continue
        rate_bits = float(rate.removesuffix("gbit")) * 1e9
        burst = max(int(rate_bits / 8 / 250), 65536)  # 4 ms of the rate: above a 64 KB GSO packet
        cmd = [*prefix, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate, "burst", str(burst),
               "latency", "50ms"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed: {out.stderr.strip()} (tc needs root and iproute2)")


def driver(args: argparse.Namespace) -> None:
    """Runs in host0's namespace, joined to the cluster in RAY_ADDRESS; prints one JSON line per Row."""
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from common import median_s
    from lora_push import tiny_policy

    from vagent.models.remote import NAMESPACE, RemoteEngine, pushed_state, start_ray

    torch.set_num_threads(2)
    ray = start_ray()
    shapes = qwen25_vl_3b_shapes()
    sliced = {k: s for k, s in shapes.items() if (layer_of(k) or 0) < args.layers}
    lora = lora_shapes(shapes, r=16)
    _, loaded, policy = tiny_policy(Path(tempfile.mkdtemp(prefix="vagent-push-link-")))
    full = {k: v.detach() for k, v in policy.get_base_model().state_dict().items()}
    big, big_lora = random_state(sliced), random_state(lora, seed=1)
    engines, sinks, handles = {}, {}, []
    for place, res in PLACES.items():
        engines[place] = RemoteEngine(policy, loaded.encoder, replicas=1, resources={res: 1}, push_timeout_s=300)
        name = f"push-link-sink-{res}"  # the handle is kept: an unreferenced actor ends
        handles.append(ray.remote(Sink).options(name=name, namespace=NAMESPACE, num_cpus=0,
                                                resources={res: 1}).remote())
        sinks[place] = RemoteEngine.attach([name], None, push_timeout_s=300)
    payloads = {  # name -> (bytes, receivers, push)
        "tiny full": (sum(t.numel() * t.element_size() for t in full.values()), engines,
                      lambda e: e.update_state(full)),
        "tiny LoRA": (sum(t.numel() * t.element_size() for t in pushed_state(policy).values()), engines,
                      lambda e: e.update_weights(policy)),
        f"3B slice (embed + {args.layers} layers)": (nbytes_of(sliced), sinks, lambda e: e.update_state(big)),
        "3B LoRA (36 layers)": (nbytes_of(lora), sinks, lambda e: e.update_state(big_lora)),
    }
    print(json.dumps({"meta": {"full_3b_bytes": nbytes_of(shapes), "slice_tensors": len(sliced),
                               "lora_3b_tensors": len(lora)}}), flush=True)
    try:
        for cap in [None, *args.rates]:
            cap_link(args.far_netns, cap)
            places = list(PLACES) if cap is None else ["veth"]
            for payload, (size, receivers, push) in payloads.items():
                for place in places:
                    engine = receivers[place]
                    push(engine)  # untimed
                    interface = "eth0" if place == "veth" else "lo"
                    before = sent_bytes(interface)
                    seconds = median_s(lambda: push(engine), args.rounds)
                    wire = (sent_bytes(interface) - before) / args.rounds
                    row = Row(payload, size, place, cap or "", seconds, wire)
                    print(json.dumps(asdict(row)), flush=True)
    finally:
        cap_link(args.far_netns, None)
    for engine in engines.values():
        engine.close()
    for handle in handles:
        ray.kill(handle)


# --------------------------------------------------------------------------------- the orchestrator
def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return {**env, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled",
            "PYTHONPATH": str(ROOT), **extra}


def ray_start(cl, host: int, node_ip: str, temp_dir: str, log: Path, *args: str, pull_timeout_ms: int = 0) -> None:
    env = _env(RAY_object_manager_pull_timeout_ms=str(pull_timeout_ms)) if pull_timeout_ms else _env()
    cmd = [RAY, "start", "--node-ip-address", node_ip, "--num-cpus", "1", "--disable-usage-stats",
           "--object-store-memory", str(OBJECT_STORE_BYTES), "--temp-dir", temp_dir, *args]
    with open(log, "wb") as out:
        code = subprocess.run(cl.exec_args(host, cmd), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
                              timeout=240).returncode
    if code != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` on host{host} failed ({code}):\n{log.read_text()[-3000:]}")


def measure(args: argparse.Namespace) -> tuple[dict, list[Row]]:
    from tests.multihost import cluster as C

    why = C.unavailable()
    if why:
        raise SystemExit(f"push_link needs network namespaces: {why}")
    cl = C.up(2)
    temps = [tempfile.mkdtemp(prefix=f"vpl{i}-", dir="/tmp") for i in range(3)]  # short: Ray's socket paths
    logs = Path(tempfile.mkdtemp(prefix="vagent-push-link-logs-"))
    head = f"{cl.host(0).address}:{PORT}"
    meta, rows = {}, []
    try:
        ray_start(cl, 0, cl.host(0).address, temps[0], logs / "head.log", "--head", "--port", str(PORT),
                  "--include-dashboard=false", "--resources", '{"push_same": 2}', pull_timeout_ms=args.pull_timeout_ms)
        ray_start(cl, 0, "127.0.0.1", temps[1], logs / "loop.log", "--address", head,
                  "--resources", '{"push_loop": 2}', pull_timeout_ms=args.pull_timeout_ms)
        ray_start(cl, 1, cl.host(1).address, temps[2], logs / "far.log", "--address", head,
                  "--resources", '{"push_far": 2}', pull_timeout_ms=args.pull_timeout_ms)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--driver", "--far-netns", cl.host(1).netns,
               "--rounds", str(args.rounds), "--layers", str(args.layers), "--rates", ",".join(args.rates)]
        run = subprocess.Popen(cl.exec_args(0, cmd), cwd=ROOT, stdout=subprocess.PIPE, text=True,
                               env=_env(RAY_ADDRESS=head, OMP_NUM_THREADS="2"))
        assert run.stdout is not None
        for line in run.stdout:
            if line.startswith("{"):
                record = json.loads(line)
                if "meta" in record:
                    meta = record["meta"]
                else:
                    rows.append(Row(**record))
                    print(f"  measured: {rows[-1].payload} -> {rows[-1].link}: {rows[-1].seconds:.3f} s", flush=True)
            else:
                print(line, end="")
        if run.wait() != 0:
            raise RuntimeError(f"the pushing process failed ({run.returncode}); Ray's logs: {logs}")
    finally:
        C.stop_all(cl.host(1).netns)
        C.stop_all(cl.host(0).netns)
        C.down(cl)
        for t in temps:
            shutil.rmtree(t, ignore_errors=True)
        left = [ns for ns in C.namespaces() if ns.startswith(cl.prefix)]
        if left:
            print(f"WARNING: namespaces left: {left}", file=sys.stderr)
    return meta, rows


def report(meta: dict, rows: list[Row]) -> None:
    loop = {r.payload: r.seconds for r in rows if r.place == "loopback"}
    print(f"\n3B slice: {meta['slice_tensors']} tensors; 3B LoRA: {meta['lora_3b_tensors']} tensors; the whole 3B "
          f"language model: {meta['full_3b_bytes'] / 1e9:.2f} GB\n"
          "| payload | MB | link | s / push | effective Gbit/s | x loopback | s over loopback | wire MB / push |\n"
          "|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.payload} | {r.nbytes / 1e6:.2f} | {r.link} | {r.seconds:.3f} | {r.gbit_s:.2f} | "
              f"{r.seconds / loop[r.payload]:.2f} | {r.seconds - loop[r.payload]:+.3f} | {r.wire_bytes / 1e6:.2f} |")
    by = {(r.payload, r.link): r for r in rows}
    links = list(dict.fromkeys(r.link for r in rows))
    sliced = next(p for p in loop if p.startswith("3B slice"))
    full_3b = meta["full_3b_bytes"]
    print(f"\nWhat the adapter-only push saves (3B whole language model, {full_3b / 1e9:.2f} GB: EXTRAPOLATED from "
          f"the slice's seconds x {full_3b / by[(sliced, links[0])].nbytes:.2f}, its bytes ratio):\n"
          "| link | tiny full s | tiny LoRA s | tiny saved | 3B whole s (extrapolated) | 3B LoRA s | 3B saved |\n"
          "|---|---|---|---|---|---|---|")
    for link in links:
        tf, tl = by[("tiny full", link)].seconds, by[("tiny LoRA", link)].seconds
        s = by[(sliced, link)]
        bf, bl = s.seconds * full_3b / s.nbytes, by[("3B LoRA (36 layers)", link)].seconds
        print(f"| {link} | {tf:.3f} | {tl:.3f} | {tf - tl:.3f} s ({tf / tl:.1f}x) | {bf:.2f} | {bl:.3f} | "
              f"{bf - bl:.2f} s ({bf / bl:.0f}x) |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="timed pushes per figure (median)")
    ap.add_argument("--layers", type=int, default=4, help="the 3B slice's layers (of 36), beside the embeddings")
    ap.add_argument("--rates", type=lambda s: [x for x in s.split(",") if x], default=["10gbit", "1gbit"],
                    help="tbf caps of the veth, each NNgbit (comma-separated; '' for none)")
    ap.add_argument("--pull-timeout-ms", type=int, default=0,
                    help="Ray's object_manager_pull_timeout_ms on every node (0: Ray's default, 10000)")
    ap.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--far-netns", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not 1 <= args.layers <= 36:
        raise SystemExit(f"--layers must be 1..36 (the 3B has 36 layers), got {args.layers}")
    bad = [r for r in args.rates if not r.endswith("gbit")]
    if bad:
        raise SystemExit(f"--rates takes caps like 10gbit,1gbit (tc's unit gbit), got {bad}")
    if args.driver:
        driver(args)
        return 0
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[:3]
    t0 = time.monotonic()
    meta, rows = measure(args)
    with open("/proc/loadavg") as f:
        load_after = f.read().split()[:3]
    report(meta, rows)
    print(f"\n{time.monotonic() - t0:.0f} s in all; load average before {' '.join(load_before)}, "
          f"after {' '.join(load_after)}; median of {args.rounds} pushes per figure; Ray's pull timeout "
          f"{args.pull_timeout_ms or 'default (10000)'} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
