"""``VLLMEngine``: the ``Engine`` protocol on vLLM's V1 engine (GPU only), with weight transfer.

STATUS: UNTESTED. vLLM publishes CUDA-only wheels (and pins its own torch), so it cannot be
installed on the CPU development machine; this module was written from vLLM's documented V1 APIs
(``LLM.generate`` on token prompts with ``multi_modal_data``, per-request ``SamplingParams``,
the weight-transfer API ``init_weight_transfer_engine / start_weight_update / update_weights /
finish_weight_update`` driven by a trainer-side engine, ``LLM.sleep / wake_up``) and is checked by
``tests/models/test_vllm_engine.py`` (marked ``gpu``) against ``HFEngine`` on a GPU machine.

What it does:

- **Token ids in, token ids out.** Prompts are ``{"prompt_token_ids": ids, "multi_modal_data":
  {"image": [PIL images]}}``; the reply is exactly vLLM's ``CompletionOutput.token_ids``, cut with
  the same ``cut_reply`` rules as ``HFEngine`` (docs/algorithms.md reference bug 6: train on the sampled ids). vLLM
  runs its own image processor, so each run of ``<|image_pad|>`` tokens is collapsed to one
  (TRL issue #6294: pre-expanded ids would be expanded twice) and the encoder's pixel range is
  passed as ``mm_processor_kwargs`` so vLLM's image grid equals ``ChatEncoder``'s.
- **Log-probs.** ``SamplingParams(logprobs=0)`` returns the sampled token's log-prob; the engine
  is built with ``logprobs_mode="processed_logprobs"``: the log-softmax of logits / temperature,
  what ``HFEngine`` records, when top-k / top-p are off (with them on, vLLM's value is of the
  truncated distribution; the recipes rescore log pi_old anyway). Greedy uses temperature 1.
- **Stop strings and EOS**: ``stop`` with ``include_stop_str_in_output``, ``stop_token_ids`` = the
  encoder's EOS ids.
- **Seeds**: a request's ``GenerationRequest.seed`` is its ``SamplingParams.seed``; without one the
  batch seed is combined with the request's index (vLLM has no batch-level seed).
- **Weights** (``update_weights(model, version)``): vLLM's trainer-side weight-transfer engine
  (``WeightTransferTrainerFactory.trainer_init`` with ``ModuleSource(model)``) sends the trainer's
  parameters by CUDA IPC handles when the engine shares the trainer's GPU (``weight_backend="ipc"``,
  colocated) or by NCCL broadcast when it has its own (``"nccl"``); the version is committed with
  ``finish_weight_update(weight_version)`` and stamped on every later output. The prefix cache is
  reset after a push. LoRA policies must be merged first (not done here).
- **Sleep / wake** (``sleep()`` before the trainer's update, ``update_weights`` wakes it): with
  ``enable_sleep_mode`` the colocated engine frees its KV cache (and offloads its weights at level
  1) while the trainer updates; ``update_weights`` wakes the weights, loads the new ones, then
  wakes the KV cache (vLLM's advice, to avoid holding both during the load).

Not thread-safe (``LLM.generate`` is not): put a ``BatchingEngine`` in front for the async rollout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from vagent.models.engine import GenerationOutput, GenerationRequest, SamplingParams, cut_reply
from vagent.models.forward import unwrap
from vagent.models.processor import ChatEncoder

VLLM_HINT = "pip install 'vagent[vllm]'"


def import_vllm() -> Any:
    """``import vllm``, or an ImportError naming the install (CUDA-only wheels)."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            f"rollout.engine vllm needs vLLM, which is not installed: {VLLM_HINT} on a machine with a CUDA "
            "GPU (vLLM publishes no CPU wheel), or use rollout.engine hf."
        ) from exc
    return vllm


def collapse_image_runs(input_ids: Sequence[int], image_token_id: int | None) -> list[int]:
    """Replace each run of consecutive ``image_token_id`` by a single one."""
    out: list[int] = []
    for t in input_ids:
        if t == image_token_id and out and out[-1] == image_token_id:
            continue
        out.append(t)
    return out


class _LocalSyncClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over an in-process ``LLM`` (four forwarding methods);
    commits ``version`` at the end of each round."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.version: str | None = None

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: dict) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.finish_weight_update(weight_version if weight_version is not None else self.version)


class VLLMEngine:
    """``Engine`` on vLLM V1 (see the module docstring; untested here, GPU only).

    Args:
        model_path: the policy's directory (``save_pretrained`` layout) vLLM loads at start.
        encoder: its ``ChatEncoder`` (decode, EOS ids, image token, pixel range).
        gpu_memory_utilization: share of the GPU vLLM may take (weights + KV cache).
        max_model_len: context length vLLM plans its KV cache for.
        max_images_per_prompt: ``limit_mm_per_prompt`` for images.
        seed: the engine's seed.
        colocate: shares the trainer's GPU: IPC weight transfer and sleep mode.
        weight_backend: "ipc" (colocated) or "nccl" (own GPU); None = from ``colocate``.
        sleep_level: ``LLM.sleep`` level (1: offload weights, drop KV cache; 2: drop both).
        nccl_address / nccl_port: rendezvous of the NCCL backend.
        llm_kwargs: passed to ``vllm.LLM``.
    """

    #: the engine preprocesses images itself and needs them raw (``GenerationRequest.images``)
    needs_images = True
    thread_safe = False

    def __init__(self, model_path: str | Path, encoder: ChatEncoder, *, dtype: str = "bfloat16",
                 gpu_memory_utilization: float = 0.4, max_model_len: int = 8192, max_images_per_prompt: int = 8,
                 seed: int = 0, colocate: bool = True, weight_backend: str | None = None, sleep_level: int = 1,
                 nccl_address: str = "127.0.0.1", nccl_port: int = 29551, **llm_kwargs: Any):
        vllm = import_vllm()
        from vllm.config import WeightTransferConfig

        self._vllm = vllm
        self.encoder = encoder
        self.colocate = bool(colocate)
        self.weight_backend = weight_backend or ("ipc" if colocate else "nccl")
        if self.weight_backend not in ("ipc", "nccl"):
            raise ValueError(f"weight_backend must be 'ipc' or 'nccl', got {self.weight_backend!r}")
        self.sleep_level = int(sleep_level)
        self._nccl = (nccl_address, int(nccl_port))
        mm_kwargs = {"min_pixels": encoder.min_pixels, "max_pixels": encoder.max_pixels} if encoder.is_vision else None
        self.llm = vllm.LLM(
            model=str(model_path), dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len, seed=seed,
            limit_mm_per_prompt={"image": max_images_per_prompt} if encoder.is_vision else None,
            mm_processor_kwargs=mm_kwargs, logprobs_mode="processed_logprobs",
            enable_sleep_mode=self.colocate, enable_prefix_caching=True,
            weight_transfer_config=WeightTransferConfig(backend=self.weight_backend), **llm_kwargs,
        )
        self._client = _LocalSyncClient(self.llm)
        self._sender: Any = None
        self._sender_model: Any = None
        self.asleep = False
        #: the version of the weights vLLM holds (0 = loaded from model_path)
        self.weights_version = 0
        self.stats = {"requests": 0, "weight_pushes": 0}

    # ------------------------------------------------------------------ generation
    def decode(self, ids: list[int]) -> str:
        return self.encoder.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _prompt(self, i: int, r: GenerationRequest) -> dict:
        n_images = 0 if r.image_grid_thw is None else int(r.image_grid_thw.shape[0])
        if len(r.images) != n_images:
            raise ValueError(f"request {i}: VLLMEngine needs the raw images in GenerationRequest.images "
                             f"({n_images} image(s) in the prompt, {len(r.images)} given; HFPolicy passes "
                             "them when engine.needs_images)")
        prompt: dict = {"prompt_token_ids": collapse_image_runs(r.input_ids, self.encoder.image_token_id)}
        if n_images:
            prompt["multi_modal_data"] = {"image": list(r.images)}
        return prompt

    def _sampling(self, params: SamplingParams, seed: int | None) -> Any:
        sample = params.do_sample
        return self._vllm.SamplingParams(
            n=1, temperature=params.temperature if sample else 0.0, top_p=params.top_p if sample else 1.0,
            top_k=params.top_k if (sample and params.top_k > 0) else -1, max_tokens=params.max_new_tokens,
            stop=list(params.stop_strings) or None, include_stop_str_in_output=True,
            stop_token_ids=list(self.encoder.eos_token_ids), logprobs=0, seed=seed if sample else None,
            skip_special_tokens=True, repetition_penalty=1.0,
        )

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationOutput]:
        if not requests:
            raise ValueError("generate() needs at least one request")
        if self.asleep:
            self.wake_up()
        prompts = [self._prompt(i, r) for i, r in enumerate(requests)]
        seeds = [r.seed if r.seed is not None else (None if params.seed is None else params.seed * 1_000_003 + i)
                 for i, r in enumerate(requests)]
        outs = self.llm.generate(prompts, [self._sampling(params, s) for s in seeds], use_tqdm=False)
        results = []
        for out in outs:
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            lps = [float(step[t].logprob) for t, step in zip(ids, completion.logprobs)]
            n, reason = cut_reply(ids, self.encoder.eos_token_ids, self.decode, params.stop_strings)
            results.append(GenerationOutput(ids[:n], lps[:n], reason, self.decode(ids[:n]), self.weights_version))
        self.stats["requests"] += len(requests)
        return results

    # ------------------------------------------------------------------ memory and weights
    def sleep(self) -> None:
        """Free the KV cache (and offload weights at level 1) while the trainer updates (colocated)."""
        if self.colocate and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        if self.asleep:
            self.llm.wake_up(tags=list(tags) if tags else None)
            self.asleep = tags is not None and "kv_cache" not in tags

    def _trainer_sender(self, model: Any) -> Any:
        """vLLM's trainer-side transfer engine over ``model`` (built once per model)."""
        if self._sender is not None and self._sender_model is model:
            return self._sender
        if getattr(model, "get_base_model", None) is not None:
            raise ValueError("VLLMEngine.update_weights got a LoRA (PEFT) model; vLLM needs merged weights "
                             "(merge_and_unload() on a copy), which this engine does not do yet")
        from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory

        if self.weight_backend == "ipc":
            from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

            info = IPCTrainerInitInfo(rank=0, packed=True)
        else:
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            workers = int(self.llm.llm_engine.vllm_config.parallel_config.world_size)
            info = NCCLTrainerInitInfo(master_address=self._nccl[0], master_port=self._nccl[1],
                                       world_size=1 + workers, rank=0, packed=True)
        self._sender = WeightTransferTrainerFactory.trainer_init(init_info=info, client=self._client,
                                                                 source=ModuleSource(unwrap(model)))
        self._sender_model = model
        return self._sender

    def update_weights(self, model: Any, version: int | None = None) -> int:
        """Send ``model``'s weights to vLLM and commit ``version`` (default: the next one)."""
        version = self.weights_version + 1 if version is None else int(version)
        if self.asleep:
            self.wake_up(tags=["weights"])  # weights first: the KV cache is allocated after the load
        self._client.version = str(version)
        self._trainer_sender(model).send_weights()
        self.llm.reset_prefix_cache()
        if self.asleep:
            self.wake_up(tags=["kv_cache"])
        self.weights_version = version
        self.stats["weight_pushes"] += 1
        return version

    def load_weights(self, model: Any) -> None:
        """Compatibility alias of ``update_weights(model)`` (the old engine's name)."""
        self.update_weights(model)

    def close(self) -> None:
        """Stop the transfer engine and vLLM's engine core."""
        if self._sender is not None:
            self._sender.shutdown()
            self._sender = None
        shutdown = getattr(self.llm, "shutdown", None) or getattr(getattr(self.llm, "llm_engine", None),
                                                                    "shutdown", None)
        if shutdown is not None:
            shutdown()


__all__ = ["VLLMEngine", "collapse_image_runs", "import_vllm", "VLLM_HINT"]
