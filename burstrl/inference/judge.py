"""A model served with vLLM as a reward function: the judge (a verifier or reward model) behind servers.reward.

For each row the judge reads score.judge.template, formatted with the row's prompt, completion and task
columns, and the reward is the probability it gives the continuation `right` against `wrong`:
P(right) / (P(right) + P(wrong)), each the product of its tokens' probabilities. Both come from one
`prompt_logprobs` pass over judge prompt + continuation, the same call as score's reference logprobs, and the
text is tokenized by the judge's own server (`/tokenize`), so this side needs neither its weights nor its
tokenizer. A generative judge answering yes/no, or a verifier trained to say so, fits as it is.
"""

import math

from burstrl.config import JudgeConfig
from burstrl.inference.client import Pool


class Judge:
    """What burstrl.rl.rewards.judge calls; the score stage builds it when score.judge.model is set."""

    def __init__(self, pool: Pool, cfg: JudgeConfig):
        self.pool, self.cfg = pool, cfg

    def tokenize(self, texts: list[str], special: bool) -> list[list[int]]:
        bodies = [{"prompt": t, "add_special_tokens": special} for t in texts]
        return [r["tokens"] for r in self.pool.map("/tokenize", bodies)]

    def __call__(self, prompts: list[str], completions: list[str], columns: dict[str, list]) -> list[float]:
        texts = [self.cfg.template.format(prompt=p, completion=c, **{k: v[i] for k, v in columns.items()})
                 for i, (p, c) in enumerate(zip(prompts, completions, strict=True))]
        ids = self.tokenize(texts, special=True)
        right, wrong = self.tokenize([self.cfg.right, self.cfg.wrong], special=False)
        both = self.pool.token_logprobs(ids + ids, [right] * len(ids) + [wrong] * len(ids))
        return [1.0 / (1.0 + math.exp(sum(w) - sum(r))) for r, w in zip(both[:len(ids)], both[len(ids):], strict=True)]
