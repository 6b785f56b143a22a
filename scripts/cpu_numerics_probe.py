"""Fingerprint the CPU kernels a vagent run uses, one op at a time, to find which library makes two CPUs part.

    python scripts/cpu_numerics_probe.py > mine.json          # the kernel pins of the vagent command
    MKL_CBWR=COMPATIBLE python scripts/cpu_numerics_probe.py > mine-compat.json
    python scripts/cpu_numerics_probe.py --compare theirs.json mine.json

Each probe runs one op family of the default run (MKL's GEMMs, oneDNN's convolution, ATen's
vectorised reductions and transcendentals, the AdamW update, the RNG) at the tiny model's shapes on
inputs built from integers (so the inputs are the same everywhere) and records a SHA-256 of the
output's bytes. Two machines whose fingerprints agree for every probe compute those ops bit for bit
alike under that setting; the first probe that differs names the library. The fingerprint also
records which branch MKL ran (``MKL_VERBOSE``'s ``CNR:`` field): on a non-Intel CPU MKL runs its
``AUTO`` branch whatever ``MKL_CBWR`` names, unless it names ``COMPATIBLE`` (docs/results.md,
'Results on other CPUs').

Set the variables before this script starts; ``--no-mkldnn`` turns oneDNN off inside it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vagent.numerics import pin_cpu_kernels  # noqa: E402  (no torch import)


def _inputs(*shape: int, salt: int = 0):
    """A float32 tensor of ``shape`` in [-0.5, 0.5) from integer arithmetic only (CPU-independent)."""
    import torch

    n = 1
    for s in shape:
        n *= s
    i = torch.arange(n, dtype=torch.int64) + salt * 7919
    return (((i * 2654435761) % 1048576).to(torch.float32) / 1048576.0 - 0.5).reshape(shape)


def _digest(*tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def probes() -> dict[str, str]:
    """One digest per op family, at the shapes of the default run's tiny Qwen3-VL (hidden 128, 32-dim
    heads, vision hidden 64, patch 16 x 16 x 2 frames, vocabulary 4096)."""
    import torch
    import torch.nn.functional as F

    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the default run's threads (the split of a GEMM or a reduction follows them)
    try:
        return _probes()
    finally:
        torch.set_num_threads(threads)


def _probes() -> dict[str, str]:
    import torch
    import torch.nn.functional as F

    out: dict[str, str] = {}
    x, w = _inputs(300, 128, salt=1), _inputs(512, 128, salt=2)
    out["mkl/linear 300x128 @ 128x512"] = _digest(F.linear(x, w))
    out["mkl/linear 300x128 @ 128x4096 (lm head)"] = _digest(F.linear(x, _inputs(4096, 128, salt=3)))
    out["mkl/gemm grad-weight 512x300 @ 300x128"] = _digest(_inputs(300, 512, salt=4).t() @ x)
    out["mkl/bmm attention 8x(300x32 @ 32x300)"] = _digest(torch.bmm(_inputs(8, 300, 32, salt=5),
                                                                  _inputs(8, 32, 300, salt=6)))
    out["mkl/linear 17x128 @ 128x512 (one decode step)"] = _digest(F.linear(x[:17], w))
    patches = _inputs(36, 3, 2, 16, 16, salt=7)
    conv_w = _inputs(64, 3, 2, 16, 16, salt=8).requires_grad_(True)
    y = F.conv3d(patches, conv_w, stride=(2, 16, 16))
    out["onednn/conv3d patch embedding"] = _digest(y)
    y.backward(_inputs(*y.shape, salt=9))
    out["onednn/conv3d weight grad"] = _digest(conv_w.grad)
    patches = _inputs(144, 3, 2, 16, 16, salt=13)  # four images of a multi-turn SFT chat
    conv_b = torch.zeros(64, requires_grad=True)
    y = F.conv3d(patches, conv_w, conv_b, stride=(2, 16, 16))
    conv_w.grad = None
    y.backward(_inputs(*y.shape, salt=14))
    out["onednn/conv3d 144 patches: weight and bias grads (gemm:jit)"] = _digest(conv_w.grad, conv_b.grad)
    q, k, v = (_inputs(1, 4, 300, 32, salt=s).requires_grad_(True) for s in (15, 16, 17))
    att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    att.backward(_inputs(*att.shape, salt=18))
    out["aten/sdpa causal attention forward + backward"] = _digest(att, q.grad, k.grad, v.grad)
    logits = _inputs(300, 4096, salt=10) * 20
    out["aten/softmax"] = _digest(torch.softmax(logits, -1))
    out["aten/log_softmax + cross_entropy"] = _digest(
        F.cross_entropy(logits, (torch.arange(300) * 37) % 4096, reduction="none"))
    out["aten/sum over 4096"] = _digest(logits.sum(-1))
    out["aten/mean of squares + rsqrt (rmsnorm)"] = _digest(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    out["aten/layer_norm"] = _digest(F.layer_norm(x, (128,)))
    out["aten/exp"] = _digest(torch.exp(x * 10))
    out["aten/log"] = _digest(torch.log(x + 0.6))
    out["aten/silu"] = _digest(F.silu(x * 8))
    out["aten/gelu tanh"] = _digest(F.gelu(x * 8, approximate="tanh"))
    out["aten/cos sin (rope)"] = _digest(torch.cos(x * 50), torch.sin(x * 50))
    p = torch.nn.Parameter(_inputs(512, 128, salt=11))
    opt = torch.optim.AdamW([p], lr=1e-3)
    for k in range(3):
        p.grad = _inputs(512, 128, salt=12 + k)
        opt.step()
    out["aten/adamw 3 steps"] = _digest(p)
    g = torch.Generator().manual_seed(0)
    out["aten/randn"] = _digest(torch.randn(1000, generator=g))
    out["aten/multinomial"] = _digest(torch.multinomial(torch.softmax(logits[:8], -1), 4, generator=g))
    return out


def _mkl_branch() -> str:
    """The branch MKL's GEMM ran (``CNR:`` in MKL_VERBOSE), from a child process with this environment."""
    code = "import torch; torch.set_num_threads(2); torch.ones(64, 64) @ torch.ones(64, 64)"
    env = dict(os.environ, MKL_VERBOSE="1")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    for tok in (res.stdout + res.stderr).split():
        if tok.startswith("CNR:"):
            return tok[4:]
    return "unknown (no MKL_VERBOSE line)"


def fingerprint(no_mkldnn: bool = False) -> dict:
    pin_cpu_kernels()
    import torch

    if no_mkldnn:
        torch.backends.mkldnn.enabled = False
    from vagent.runs.environment import describe_environment

    env = describe_environment()
    return {"cpu": {k: env[k] for k in ("cpu_model", "cpu_vendor", "cpu_flags") if k in env},
            "settings": {**env["cpu_kernel_env"], "cpu_capability": env["cpu_capability"],
                         "mkldnn_enabled": torch.backends.mkldnn.enabled, "mkl_cnr_branch": _mkl_branch()},
            "torch": torch.__version__, "probes": probes()}


#: probes whose digest is not the same in every process on one CPU (tests/test_cpu_numerics_probe.py
#: measured it): ``torch.exp`` of the 300 x 128 input differed in 6 of 60 fresh processes on a 2-core
#: Intel Xeon VM, mostly beside a busy loop. A difference in one of them between two CPUs says nothing.
UNSTABLE = frozenset({"aten/exp"})


def compare(a: dict, b: dict) -> list[str]:
    """The probes whose digests differ between two fingerprints."""
    return [k for k in a["probes"] if a["probes"].get(k) != b["probes"].get(k)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-mkldnn", action="store_true", help="torch.backends.mkldnn.enabled = False")
    ap.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), help="list the probes that differ")
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        for side, fp in (("A", a), ("B", b)):
            print(f"{side}: {fp['cpu'].get('cpu_model')} {fp['settings']}")
        diff = compare(a, b)
        print("\n".join(f"differs: {k}" + (" (it also differs between processes on one CPU)" if k in UNSTABLE else "")
                        for k in diff) or f"all {len(a['probes'])} probes equal")
        return 1 if diff else 0
    print(json.dumps(fingerprint(args.no_mkldnn), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
