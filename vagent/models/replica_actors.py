"""The bodies of the engine-replica Ray actors (``EngineReplica``, ``VLLMReplica``) and what a
weight push sends to them and checks there. ``vagent.models.remote`` wraps them as actors and
routes to them (``RemoteEngine``); every name here is importable from there too.

Weights versions while pushes land during generation (the streaming rollout): each replica has a
``PushGate``. A ``generate`` call holds it shared from the moment it reads the replica's weights
version until its last output is back, so no push lands in between and the stamp
(``GenerationOutput.weights_version``) is the version of the weights that produced every output
of the call. A push (``load_weights``, ``load_adapter``) waits for the running calls to finish and
holds new ones back meanwhile (writer preference: a stream of generate calls from many threads
cannot starve it); the calls held back run on the new weights, stamped with the new version. The
caller's deadline (``rollout.push_timeout_s``) covers that wait: a push stays a single remote call.

Importing this module imports neither Ray nor vLLM nor torch nor transformers: the engines load
inside the actors. Ray unpickles an actor's arguments before its ``__init__`` runs, and unpickling a model
or a processor imports torch and transformers; ``RemoteEngine`` therefore hands the replicas their
model and encoder as ``Deferred`` arguments, which ``__init__`` unpickles itself inside
``vagent.startup.heavy_imports`` (the garbage collector off, then frozen).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from vagent.models.generation import GenerationOutput, GenerationRequest, SamplingParams
from vagent.runs.errors import TrainingError
from vagent.startup import freeze_set_up, heavy_imports


class NoReplicaLeft(TrainingError):
    """Every engine replica is dead (died, or stuck past its deadline and killed): the run stops; the
    message names each replica's fate and the deadline to raise if they were only slow."""


class ReplicaTimeout(TrainingError, TimeoutError):
    """A replica did not start (load its weights, or get the CPUs / GPUs / custom resources it asks
    for) within ``rollout.push_timeout_s``, or did not answer a call by index (a weight check's
    ``logprobs`` or ``generate``, ``stats``) within ``rollout.generate_timeout_s``: a
    ``TimeoutError`` to the caller, and a ``TrainingError``, so a run that it stops says it in one
    line, without a traceback."""


class ReplicaLost(TrainingError):
    """A replica asked by index (``generate_on``, ``replica_logprobs``) died during the call; it is
    marked dead, so routing skips it from then on. A ``TrainingError``: a run that it stops (the
    weight check's last live replica) says it in one line."""


class PushGate:
    """A readers-writer gate with writer preference: ``generating()`` (shared: any number of
    generate calls at once) against ``pushing()`` (exclusive: one weight push, no generate call).
    A push waits for the running calls; while one waits, new calls wait for it."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._running = 0  # generate calls inside the gate
        self._pushing = False  # a push is inside the gate
        #: pushes waiting to enter (new generate calls wait while any does)
        self.pushes_waiting = 0

    @contextmanager
    def generating(self) -> Iterator[None]:
        with self._cv:
            while self._pushing or self.pushes_waiting:
                self._cv.wait()
            self._running += 1
        try:
            yield
        finally:
            with self._cv:
                self._running -= 1
                if not self._running:
                    self._cv.notify_all()

    @contextmanager
    def pushing(self) -> Iterator[None]:
        with self._cv:
            self.pushes_waiting += 1
            try:
                while self._pushing or self._running:
                    self._cv.wait()
            finally:
                self.pushes_waiting -= 1
            self._pushing = True
        try:
            yield
        finally:
            with self._cv:
                self._pushing = False
                self._cv.notify_all()


class Deferred:
    """An actor argument that the actor unpickles itself (:meth:`load`), not Ray before ``__init__``
    (module docstring): ``Deferred(obj)`` holds ``obj`` pickled; ``Deferred(ref=ray.put(obj))``
    holds an object-store reference (a model that several replicas share), which Ray leaves
    unresolved inside this wrapper."""

    def __init__(self, obj: Any = None, *, ref: Any = None) -> None:
        try:  # what Ray pickles arguments with (lambdas, local classes), where Ray is installed
            from ray import cloudpickle as pickler
        except ImportError:
            import pickle as pickler

        self.ref = ref
        self.payload: bytes = b"" if ref is not None else pickler.dumps(obj)

    def load(self) -> Any:
        if self.ref is not None:
            import ray

            return ray.get(self.ref)
        import pickle

        return pickle.loads(self.payload)


def resolved(arg: Any) -> Any:
    """``arg``, or what it holds if it is a :class:`Deferred`."""
    return arg.load() if isinstance(arg, Deferred) else arg


class EngineReplica:
    """One replica (the body of the Ray actor): a model copy, its HFEngine, a batching front."""

    def __init__(self, model: Any, encoder: Any, prefix_cache: bool = True, threads: int = 1,
                 max_batch: int = 64, interrupt: bool = False) -> None:
        with heavy_imports():  # a Deferred model and encoder import torch and transformers here
            import torch

            from vagent.models.batching import BatchingEngine
            from vagent.models.engine import HFEngine

            model, encoder = resolved(model), resolved(encoder)

        if threads > 0:
            torch.set_num_threads(threads)
        self.model = model
        self.model.requires_grad_(False)
        self.engine = BatchingEngine(HFEngine(model, encoder, prefix_cache=prefix_cache), max_batch=max_batch)
        self.version = 0
        #: generate calls against weight pushes (module docstring)
        self.gate = PushGate()
        if interrupt:  # rollout.interrupt: a waiting push stops the running replies between decode steps
            self.engine.engine.interrupt = lambda: self.gate.pushes_waiting > 0
        freeze_set_up()  # the model and engine too: they live as long as the actor

    def ready(self) -> tuple[int, bool, bool]:
        """(this actor's pid, whether its engine needs the raw images, whether a waiting push stops
        its running replies: ``rollout.interrupt`` as this replica was built)."""
        return os.getpid(), False, getattr(self.engine.engine, "interrupt", None) is not None

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationOutput]:
        with self.gate.generating():  # no push lands until the outputs are back: they are this version's
            version = self.version
            outputs = self.engine.generate(requests, params)
        for out in outputs:
            out.weights_version = version
        return outputs

    def load_weights(self, state_dict: dict, version: int) -> int:
        """Load the trainer's weights once the running generate calls are done; later outputs carry
        ``version``. A state of adapter tensors only (a LoRA push, :func:`pushed_state`) replaces just
        those, after checking that each names an adapter tensor of this replica with the same shape."""
        with self.gate.pushing(), self.engine.exclusive():
            own = self.model.state_dict()
            partial = set(state_dict) != set(own)
            if partial:
                check_adapter_push(state_dict, own)
            self.model.load_state_dict(state_dict, strict=not partial)  # bumps the versions: cache dropped
            self.version = int(version)
        return self.version

    def logprobs(self, input_ids: list[int], n_prompt: int, temperature: float = 1.0) -> list[float]:
        """``sequence_token_logprobs`` of this replica's model (weight checks)."""
        with self.engine.exclusive():
            return sequence_token_logprobs(self.model, input_ids, n_prompt, temperature)

    def stats(self) -> dict:
        return {**self.engine.stats, **self.engine.engine.stats, "version": self.version}


class VLLMReplica:
    """One vLLM replica (the body of a Ray actor): a ``VLLMEngine`` on the policy's directory behind
    a ``BatchingEngine`` (vLLM's ``generate`` is not thread-safe; the actor takes concurrent calls).
    The engine stamps each output with the version vLLM recorded for it (a push holds the engine
    between batches, so a batch runs on one version); the ``PushGate`` gives pushes precedence
    over new generate calls. With ``interrupt`` (``rollout.interrupt``) a waiting push stops the
    running replies between two of vLLM's scheduler steps (``VLLMEngine.interrupt``)."""

    def __init__(self, model_dir: str, encoder: Any, engine_kwargs: dict, max_batch: int = 64,
                 interrupt: bool = False) -> None:
        with heavy_imports():  # a Deferred encoder imports transformers here; vLLM's own imports
            from vagent.models.batching import BatchingEngine
            from vagent.models.vllm_engine import VLLMEngine

            encoder = resolved(encoder)
        self.vllm = VLLMEngine(model_dir, encoder, colocate=False, **engine_kwargs)
        self.vllm.start()  # now, not at the first push: ready() answers once the engine is up
        self.engine = BatchingEngine(self.vllm, max_batch=max_batch)
        self.gate = PushGate()
        if interrupt:  # rollout.interrupt: a waiting push stops the running replies between scheduler steps
            self.vllm.interrupt = lambda: self.gate.pushes_waiting > 0
        freeze_set_up()  # vagent/startup.py

    def ready(self) -> tuple[int, bool, bool]:
        """(this actor's pid, whether its engine needs the raw images: yes, whether a waiting push
        stops its running replies: ``rollout.interrupt`` as this replica was built)."""
        return os.getpid(), True, self.vllm.interrupt is not None

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationOutput]:
        with self.gate.generating():
            return self.engine.generate(requests, params)

    def load_weights(self, state_dict: dict, version: int) -> int:
        """Push the trainer's full state dict into vLLM between batches; later outputs carry ``version``."""
        with self.gate.pushing(), self.engine.exclusive():
            return self.vllm.update_state(state_dict, version)

    def load_adapter(self, state_dict: dict, lora_config: dict, version: int) -> int:
        """Serve the trainer's LoRA adapter from the next batch on (``VLLMEngine.update_adapter``)."""
        with self.gate.pushing(), self.engine.exclusive():
            return self.vllm.update_adapter(state_dict, lora_config, version)

    def stats(self) -> dict:
        return {**self.engine.stats, **self.vllm.stats, "version": self.vllm.weights_version}

    def close(self) -> None:
        """Stop the batching front and vLLM's engine (its engine-core process)."""
        self.engine.close()
        self.vllm.close()


def adapter_names(model: Any) -> set[str] | None:
    """The state-dict names (of the unwrapped model) of a LoRA policy's adapter tensors, when the
    policy trains only those (every trainable parameter is a ``lora_`` tensor); None otherwise (a
    full fine-tune, or no LoRA)."""
    from vagent.models.forward import unwrap

    trainable = [n for n, p in unwrap(model).named_parameters() if p.requires_grad]
    if not trainable or not all("lora_" in n for n in trainable):
        return None
    return set(trainable)


def pushed_state(model: Any) -> dict:
    """What a weight push sends to HF replicas: a LoRA policy's adapter tensors only (the frozen base
    is the same on every replica), else the whole state dict; on the CPU, detached."""
    from vagent.models.forward import unwrap

    state = unwrap(model).state_dict()
    names = adapter_names(model)
    return {k: v.detach().to("cpu") for k, v in state.items() if names is None or k in names}


def check_adapter_push(state: dict, own: dict) -> None:
    """Refuse a partial push that is not an adapter of this model: names it does not have, tensors
    that are not ``lora_`` ones, or shapes that differ (a LoRA of another rank or target)."""
    unknown = sorted(k for k in state if k not in own)
    not_adapter = sorted(k for k in state if k in own and "lora_" not in k)
    shapes = sorted(f"{k}: pushed {tuple(state[k].shape)}, replica {tuple(own[k].shape)}" for k in state
                    if k in own and tuple(state[k].shape) != tuple(own[k].shape))
    if unknown or not_adapter or shapes:
        raise ValueError(
            "the pushed weights are neither the whole model nor its LoRA adapter: "
            + "; ".join(part for part in (
                f"{len(unknown)} name(s) this replica does not have (first: {unknown[:3]})" if unknown else "",
                f"{len(not_adapter)} non-adapter tensor(s) in a partial push (first: {not_adapter[:3]})"
                if not_adapter else "",
                f"other shapes ({shapes[:3]})" if shapes else "") if part)
            + ". The trainer's LoRA settings (model.lora_rank, target modules) must be the replicas'.")


def sequence_token_logprobs(model: Any, input_ids: Sequence[int], n_prompt: int,
                            temperature: float = 1.0) -> list[float]:
    """log pi(token_t | tokens before t) / temperature-softmax of ``input_ids[n_prompt:]``: one
    text-only forward of ``model`` on one token sequence, in eval mode without grad (the
    trainer-vs-replica weight check). Not ``vagent.models.forward.token_logprobs``, which reads
    log-probs off logits already computed."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ids = torch.tensor([list(input_ids)], device=next(model.parameters()).device)
            logits = model(input_ids=ids).logits[0, n_prompt - 1:-1].float() / temperature
            return torch.log_softmax(logits, -1).gather(-1, ids[0, n_prompt:, None])[:, 0].tolist()
    finally:
        model.train(was_training)


__all__ = ["EngineReplica", "VLLMReplica", "PushGate", "NoReplicaLeft", "ReplicaLost", "ReplicaTimeout",
           "adapter_names", "check_adapter_push", "pushed_state", "sequence_token_logprobs"]
