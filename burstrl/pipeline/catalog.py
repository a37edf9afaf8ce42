"""The stages and charts of a run, listed once: status shows these stages, history times and prices them, and
the HTML report draws these charts. dvc.yaml declares the same stages and plots for DVC, which reads no
Python; tests/test_report.py keeps its plots equal to PLOTS.
"""

ITERATION_STAGES = ("generate", "score", "train", "eval", "sync")  # per iteration of iterations.yaml, in order
# Row 000 of status: the stages that make the bootstrap policy, by column name and DVC stage name.
BOOTSTRAP_STAGES = {"prepare": "prepare", "bootstrap": "bootstrap", "sync": "sync-bootstrap"}
TIMED_STAGES = ("bootstrap", *ITERATION_STAGES)  # those whose seconds the history records and prices
TRAINING_STAGES = ("bootstrap", "train")  # priced at cost.train_usd_per_hour, the others at the inference price

# (title, history keys) of `dvc plots show`, from report/history.json against `iteration`.
PLOTS = [
    ("Reward and held-out accuracy", ["reward_mean", "heldout_accuracy"]),
    ("KL to the reference and from the sampler", ["kl_ref", "sampler_kl"]),
    ("Sampler gap: quantization and staleness", ["quantization_kl", "staleness_kl"]),
    ("Completion length", ["completion_length"]),
    ("Seconds per stage", [f"seconds_{stage}" for stage in ITERATION_STAGES]),
]
# The HTML report's charts: DVC's, and the running cost, which DVC does not plot.
CHARTS = [*PLOTS, ("Cost so far (USD)", ["cost_usd_total"])]
# Drawn too when the run has episodes (docs/environments.md): held-out greedy episodes and the sampled ones.
EPISODE_CHARTS = [
    ("Held-out tool use and accuracy with and without it", ["tool_use_rate", "accuracy_with_tool",
                                                            "accuracy_without_tool"]),
    ("Per sampled episode: turns, tool calls, tool errors", ["turns_mean", "tool_calls_per_episode",
                                                             "tool_errors_per_episode"]),
]
