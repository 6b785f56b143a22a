"""Heavy engines are extras: importing vagent never imports ray or vllm, and a missing extra is an
error naming the pip install (fresh processes)."""

from __future__ import annotations

import subprocess
import sys

IMPORTS = ("import sys, vagent, vagent.rollout, vagent.rollout.driver, vagent.rollout.async_loop, "
           "vagent.models.remote, vagent.models.batching, vagent.models.vllm_engine, vagent.recipes.ppo")


def run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_importing_vagent_imports_neither_ray_nor_vllm():
    assert run(IMPORTS + "; print('ray' in sys.modules, 'vllm' in sys.modules)") == "False False"


def test_a_missing_extra_names_the_pip_install():
    code = ("import sys; sys.modules['ray'] = None; sys.modules['vllm'] = None\n"
            "from vagent.models.remote import import_ray\nfrom vagent.models.vllm_setup import import_vllm\n"
            "for f in (import_ray, import_vllm):\n"
            "    try:\n        f()\n    except ImportError as e:\n        print(e)\n")
    out = run(code)
    assert "pip install 'vagent[ray]'" in out and "pip install 'vagent[vllm]'" in out
