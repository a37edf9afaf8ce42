"""The RL maths, free of any trainer: rewards, group advantages, the GRPO objective with its off-policy
corrections, which rows a batch trains on, and held-out evaluation. Imports inference and everything below."""
