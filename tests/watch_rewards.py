"""A reward that pays for length, not correctness (`watch_rewards.length`, with tests/ on the path): what the
reward-hacking watch must catch."""


def length(prompts, completions, completion_ids, **kwargs):
    return [float(len(ids)) for ids in completion_ids]

