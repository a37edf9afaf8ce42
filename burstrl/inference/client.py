"""Client of OpenAI-compatible vLLM servers (`vllm serve`, started on the inference boxes by burstrl.inference.serve).

A `Pool` answers the same calls as the offline engine (`sample`, `token_logprobs`) from one or more endpoints.
Prompts go in as token ids and come back as token ids (`return_tokens_as_token_ids`, `prompt_logprobs` keyed
by id), so nothing is re-tokenized. Requests are spread over the endpoints, `concurrency` in flight on each;
one that fails on an endpoint (refused, reset, timed out, 5xx) marks that endpoint down and goes to another;
when none is left, the pool waits for any to come back (servers.wait_seconds).
The pool asks each endpoint which model it serves (`/v1/models`) and every request names that model, so an
endpoint that serves another policy version than the stage expects, or reloads to one mid-run, stops the
stage with a ServerError rather than answering for the wrong weights.

Per-request seeds make a retried request come back identical, whichever endpoint answers it.
"""

import http.client
import json
import queue
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

from burstrl.config import ServersConfig
from burstrl.errors import ServerError
from burstrl.inference.engine import Sample, TopK, per_prompt, ranked

SCORE_BATCH = 32  # sequences per prompt_logprobs request: one HTTP round trip each, no per-row seeds needed
PROBE_SECONDS = 10.0  # `/v1/models` answers at once from a live server; a silent host must not hold a stage long


class EndpointDown(Exception):
    """An endpoint failed in a way another endpoint may not (transport error, timeout, 5xx)."""


class _Behind(Exception):
    """An endpoint serves an older version of the policy: sync has not reached it yet, or it is reloading."""


def call(url: str, path: str, body: dict | None, timeout: float) -> dict:
    """GET (body None) or POST `body` as JSON to `url + path`; the JSON answer. Raises EndpointDown for what
    another endpoint may not suffer (refused, reset, timed out, cut off mid-answer, 5xx), HTTPError otherwise."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as err:
        if err.code >= 500:
            raise EndpointDown(f"HTTP {err.code}: {err.read().decode(errors='replace')[:500]}") from err
        raise
    except (OSError, ValueError, http.client.HTTPException) as err:
        raise EndpointDown(f"{type(err).__name__}: {err}") from err


def served_models(url: str, timeout: float = PROBE_SECONDS) -> list[str]:
    """The names of the models `url` serves (`GET /v1/models`)."""
    try:
        return [m["id"] for m in call(url, "/v1/models", None, timeout)["data"]]
    except urllib.error.HTTPError as err:
        raise ServerError(f"{url}/v1/models: HTTP {err.code}: {err.read().decode(errors='replace')[:500]}") from err


def _older(served: str, expect: str) -> bool:
    """Whether served name `served` is an earlier policy version than `expect` (both `<version>-<hash12>...`)."""
    version, want = served.partition("-")[0], expect.partition("-")[0]
    return version.isdigit() and want.isdigit() and int(version) < int(want)


class Pool:
    def __init__(self, urls: list[str], expect: str, settings: ServersConfig, role: str, derived: bool = True):
        """`expect`: the served name (burstrl.data.policy.policy_name) a correct endpoint lists, or with `derived`
        also `expect@variant` (quantized weights of it); `role` names the params key (servers.<role>) in errors."""
        self.urls = [u.rstrip("/") for u in urls]
        self.expect, self.settings, self.role, self.derived = expect, settings, role, derived
        self.model = ""
        self.answered = {u: 0 for u in self.urls}
        self.failovers = 0
        self.lost: list[str] = []
        self.up: list[str] = []

    @property
    def variant(self) -> str:
        """What the endpoints serve: "checkpoint", or the label of derived weights such as w4a16-gptq."""
        return self.model.partition("@")[2] or "checkpoint"

    def stats(self) -> dict:
        return {"served_model": self.model, "requests": dict(self.answered), "failovers": self.failovers,
                "endpoints_lost": list(self.lost)}

    def _request(self, url: str, path: str, body: dict) -> dict:
        try:
            return call(url, path, body, self.settings.request_timeout_seconds)
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:500]
            if err.code == 404:
                raise ServerError(f"{url} no longer serves {self.model} (servers.{self.role}): it was reloaded "
                                  f"with other weights mid-run: {detail}") from err
            raise ServerError(f"{url}{path}: HTTP {err.code}: {detail}") from err

    def _served(self, url: str) -> str:
        ids = served_models(url)
        match = [i for i in ids if i == self.expect or (self.derived and i.startswith(self.expect + "@"))]
        if match:
            return match[0]
        message = (f"{url} (servers.{self.role}) serves {', '.join(ids) or 'nothing'}, but this stage expects "
                   f"{self.expect}: sync that checkpoint and let `python -m burstrl serve` reload, or point "
                   f"servers.{self.role} at a server of it")
        if any(_older(i, self.expect) for i in ids):
            raise _Behind(message)
        raise ServerError(message)

    def alive(self) -> list[str]:
        """The endpoints that answer now, each checked to serve the expected model. Waits up to
        servers.wait_seconds for one: a server still loading, or still serving an older version of the
        policy while it reloads after sync. Then, or at once for any other model, raises a ServerError."""
        deadline = time.monotonic() + self.settings.wait_seconds
        while True:
            up, errors = [], {}
            for url in self.urls:
                try:
                    name = self._served(url)
                except (EndpointDown, _Behind) as err:
                    errors[url] = err
                    continue
                if self.model and name != self.model:
                    raise ServerError(f"{url} serves {name} while the others serve {self.model}: one batch must "
                                      "come from one set of weights")
                self.model = name
                up.append(url)
            if up:
                return up
            if time.monotonic() > deadline:
                behind = [str(e) for e in errors.values() if isinstance(e, _Behind)]
                if behind:
                    raise ServerError(behind[0] + f" (waited {self.settings.wait_seconds:.0f}s for the reload)")
                raise ServerError(f"no endpoint of servers.{self.role} answered for {self.settings.wait_seconds:.0f}"
                                  "s: " + "; ".join(f"{u}: {e}" for u, e in errors.items()))
            time.sleep(1.0)

    def map(self, path: str, bodies: list[dict]) -> list[dict]:
        """POST every body, each answered once by some endpoint; the responses in the order of `bodies`.
        An endpoint that failed stays out until none is left; then all are asked again (`alive`). Rounds that
        answer nothing for servers.wait_seconds (every endpoint failing the same requests) stop the stage."""
        results: list[dict | None] = [None] * len(bodies)
        pending = list(range(len(bodies)))
        progress = time.monotonic()
        while pending:
            if not self.up:
                self.up = self.alive()
            left = self._round(path, bodies, pending, results)
            if len(left) < len(pending):
                progress = time.monotonic()
            elif time.monotonic() - progress > self.settings.wait_seconds:
                raise ServerError(f"servers.{self.role}: {len(left)} requests failed on every endpoint for "
                                  f"{self.settings.wait_seconds:.0f}s; the endpoints' errors are above")
            pending = left
        missing = [i for i, r in enumerate(results) if r is None]
        if missing:
            raise ServerError(f"servers.{self.role}: requests {missing[:5]} got no answer")
        return results

    def _round(self, path, bodies, pending, results) -> list[int]:
        """Serve `pending` from the endpoints up until the queue drains; returns what is left when every
        endpoint that took part failed."""
        work: queue.Queue[int] = queue.Queue()
        for index in pending:
            work.put(index)
        down: set[str] = set()
        errors: list[Exception] = []
        lock = threading.Lock()

        def worker(url: str) -> None:
            while url not in down and not errors:
                try:
                    index = work.get_nowait()
                except queue.Empty:
                    return
                try:
                    results[index] = self._request(url, path, {**bodies[index], "model": self.model})
                except EndpointDown as err:
                    work.put(index)
                    with lock:
                        self.failovers += 1
                        if url not in down:
                            down.add(url)
                            if url not in self.lost:
                                self.lost.append(url)
                            print(f"servers: {url} failed ({err}); its requests go to the other endpoints", flush=True)
                    return
                except Exception as err:  # a worker's error must reach the stage, not die with its thread
                    errors.append(err)
                    return
                with lock:
                    self.answered[url] += 1

        # Started round-robin, so that a few requests spread over the endpoints too.
        threads = [threading.Thread(target=worker, args=(url,), daemon=True)
                   for _ in range(self.settings.concurrency) for url in self.up]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        self.up = [url for url in self.up if url not in down]
        return sorted(work.queue)

    def sample(self, prompt_ids: list[list[int]], seeds: list[int], *, n: int, temperature: float, top_p: float,
               max_tokens: int | list[int], min_tokens: int = 0) -> list[list[Sample]]:
        """n completions per prompt, one request per prompt so that each carries its own seed."""
        budgets = per_prompt(max_tokens, len(prompt_ids))
        bodies = [{"prompt": ids, "n": n, "temperature": temperature, "top_p": top_p, "max_tokens": m,
                   "min_tokens": min(min_tokens, m), "seed": seed, "logprobs": 0, "return_tokens_as_token_ids": True}
                  for ids, seed, m in zip(prompt_ids, seeds, budgets, strict=True)]
        groups = []
        for response in self.map("/v1/completions", bodies):
            group = []
            for choice in sorted(response["choices"], key=lambda c: c["index"]):
                lp = choice["logprobs"]
                ids = [int(token.removeprefix("token_id:")) for token in lp["tokens"]]
                group.append(Sample(ids, [float(v) for v in lp["token_logprobs"]], choice["finish_reason"],
                                    choice["text"]))
            groups.append(group)
        return groups

    def _prompt_logprobs(self, prompt_ids, completion_ids, k: int):
        """Per sequence, vLLM's prompt logprobs at its completion tokens (token id -> logprob and rank)."""
        seqs = [p + c for p, c in zip(prompt_ids, completion_ids, strict=True)]
        starts = range(0, len(seqs), SCORE_BATCH)
        bodies = [{"prompt": seqs[i:i + SCORE_BATCH], "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": k}
                  for i in starts]
        for start, response in zip(starts, self.map("/v1/completions", bodies), strict=True):
            for choice in sorted(response["choices"], key=lambda c: c["index"]):
                comp = completion_ids[start + choice["index"]]
                yield choice["prompt_logprobs"][-len(comp):], comp

    def token_logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """The served policy's logprob of each completion token given its prompt, at temperature 1."""
        return [[float(step[str(tok)]["logprob"]) for step, tok in zip(steps, comp, strict=True)]
                for steps, comp in self._prompt_logprobs(prompt_ids, completion_ids, 0)]

    def top_logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]], k: int) -> list[TopK]:
        """`token_logprobs` and the top k at each completion token, as burstrl.inference.engine.top_logprobs."""
        result = []
        for steps, comp in self._prompt_logprobs(prompt_ids, completion_ids, k):
            ranks = [ranked(step, tok, k, lambda e: (float(e["logprob"]), e["rank"]))
                     for step, tok in zip(steps, comp, strict=True)]
            result.append(TopK(*(list(column) for column in zip(*ranks, strict=True))))
        return result


@contextmanager
def connected(urls: list[str], expect: str, settings: ServersConfig, role: str, derived: bool = True):
    """A Pool whose endpoints were checked to serve `expect`; prints what each endpoint answered at the end."""
    pool = Pool(urls, expect, settings, role, derived)
    pool.up = pool.alive()
    yield pool
    print(f"servers.{role}: {pool.model}: requests per endpoint {pool.answered}, {pool.failovers} failed over",
          flush=True)

