"""Env service: host environments in other processes and machines, losing nothing.

- :mod:`vagent.service.server`: ``vagent serve-env``, FastAPI routes over env sessions (the
  session table in :mod:`vagent.service.front`, the per-request checks in
  :mod:`vagent.service.guard`, the shared answers in :mod:`vagent.service.responses`);
- :mod:`vagent.service.transport`: the HTTP transport, the service's errors and counters, decoding;
- :mod:`vagent.service.client`: :class:`RemoteEnv` (the env contract over HTTP, restoring lost
  sessions by replay);
- :mod:`vagent.service.batch`: :class:`RemoteEnvPool`, :func:`step_many`, :func:`reset_many`,
  :func:`remote_env_factory`, :func:`remote_spec_factory`;
- :mod:`vagent.service.protocol`: the typed request/response models and the binary framing.

See docs/service.md. The names below are imported on first use, so ``vagent --help`` (which
imports ``vagent.service.cli``) loads neither httpx nor FastAPI.
"""

from __future__ import annotations

from vagent.startup import lazy_exports

_WHERE = {
    **{n: "vagent.service.client" for n in ("EnvConfigMismatch", "RemoteEnv", "RemoteEnvConfig", "RemoteEnvException", "ServiceError",
                                            "ServiceUnavailable", "Transport", "client_metrics")},
    **{n: "vagent.service.batch" for n in ("RemoteEnvPool", "remote_env_factory", "remote_spec_factory",
                                           "reset_many", "step_many")},
}

__all__ = sorted(_WHERE)


__getattr__ = lazy_exports(__name__, _WHERE)
