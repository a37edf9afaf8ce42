"""Reward functions that break the contract, by dotted name (`reward_faults.nan`, with tests/ on the path): each
scores the first row 1.0 and returns something no total can use for the second, or too few values."""

import math


def nan(prompts, completions, completion_ids, **kwargs):
    return [1.0, math.nan] + [0.0] * (len(prompts) - 2)


def inf(prompts, completions, completion_ids, **kwargs):
    return [1.0, math.inf] + [0.0] * (len(prompts) - 2)


def text(prompts, completions, completion_ids, **kwargs):
    return [1.0, "1.0"] + [0.0] * (len(prompts) - 2)


def short(prompts, completions, completion_ids, **kwargs):
    return [1.0] * (len(prompts) - 1)
