"""Benchmark what checkpoint manifests cost: the save with and without ``manifest.json``, and the
resume's check against the load a resume does anyway.

A model of ``--mb`` MB of float32 parameters with AdamW states (state.pt holds twice the model),
saved into a temporary folder on ``--dir``'s filesystem, each variant ``--repeats`` times
(alternating, after one warm-up of each):

- ``save (no manifest)``: ``save_checkpoint`` with ``write_manifest`` replaced by a no-op (the
  protocol before manifests: temporary folder, rename);
- ``save (manifest)``: ``save_checkpoint`` as it is (every file hashed and flushed to disk, then
  the manifest);
- ``save (hash only)``: the same without the flush (``fsync``): what the hashing alone costs;
- ``load``: ``load_checkpoint`` without the check (``torch.load`` of every file, what a resume reads);
- ``verify``: ``check_checkpoint`` (sizes, then SHA-256 of every file; the in-process cache cleared).

Prints medians and the ratios manifest / no manifest and verify / load.

Run:  PYTHONPATH=. python bench/checkpoint.py [--mb 256] [--repeats 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=256, help="model parameters in MB (float32)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the checkpoints are written (default: the temp folder)")
    args = ap.parse_args()

    import vagent.runs.checkpoint as ck

    side = int((args.mb * 2**20 / 4 / 4) ** 0.5)  # 4 square layers
    model = torch.nn.Sequential(*[torch.nn.Linear(side, side, bias=False) for _ in range(4)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, side)).sum().backward()
    opt.step()  # AdamW's exp_avg / exp_avg_sq exist
    times: dict[str, list[float]] = {"save (no manifest)": [], "save (manifest)": [], "save (hash only)": [],
                                     "load": [], "verify": []}
    import vagent.runs.manifest as mf
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        real, real_hash = ck.write_manifest, mf._hash_file
        for i in range(args.repeats + 1):
            for name in ("save (no manifest)", "save (manifest)", "save (hash only)"):
                ck.write_manifest = (lambda folder: {}) if name == "save (no manifest)" else real
                mf._hash_file = (lambda p, sync=False: real_hash(p)) if name == "save (hash only)" else real_hash
                t = time.perf_counter()
                path = ck.save_checkpoint(Path(tmp) / name.replace(" ", "_").strip("()"), "rl", i + 1,
                                          {"policy": model}, {"actor": opt}, keep_last=1)
                if i:
                    times[name].append(time.perf_counter() - t)
            ck.write_manifest, mf._hash_file = real, real_hash
            ck._VERIFIED.clear()
            t = time.perf_counter()
            assert ck.check_checkpoint(path) is None
            verify = time.perf_counter() - t
            t = time.perf_counter()
            for f in sorted(path.glob("*.pt")):
                torch.load(f, map_location="cpu", weights_only=True)  # what a resume reads: data only
            if i:
                times["verify"].append(verify)
                times["load"].append(time.perf_counter() - t)
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"checkpoint: {size:.0f} MiB ({args.mb} MB of parameters + AdamW states), {args.repeats} repeats")
    for k, v in med.items():
        print(f"  {k:20s} {v:7.3f} s  ({size / v:7.0f} MiB/s)")
    base = med["save (no manifest)"]
    print(f"  save with / without manifest: {med['save (manifest)'] / base:.2f}x (hash only: "
          f"{med['save (hash only)'] / base:.2f}x); verify / load: {med['verify'] / med['load']:.2f}x")


if __name__ == "__main__":
    main()
