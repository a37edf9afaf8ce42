"""params.yaml is what Hydra composes from conf/, and the typed config accepts it and rejects bad values."""

import pytest
import yaml
from conftest import REPO
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError

from burstrl.config import Config, load_config
from burstrl.errors import ConfigError


def test_params_yaml_equals_hydra_composition_of_conf():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        composed = OmegaConf.to_container(compose(config_name="config"))
    assert composed == yaml.safe_load((REPO / "params.yaml").read_text())


def test_params_yaml_loads_into_typed_config(tmp_path):
    assert load_config(REPO / "params.yaml").train.batch_size == 256
    # By hand: 6 prompts x 4 completions are 24 rollouts, which 8 divides and 16 does not.
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["generate"].update(prompts_per_iteration=6, num_generations=4)
    params["train"]["batch_size"] = 8
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert load_config(tmp_path / "params.yaml").rollouts_per_iteration == 24
    params["train"]["batch_size"] = 16
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=r"train.batch_size=16 must divide the rollout batch .* = 24\)"):
        load_config(tmp_path / "params.yaml")


@pytest.mark.parametrize(("change", "message"), [
    ({"train": {"batch_size": 7}}, "train.batch_size=7 must divide the rollout batch"),
    ({"generate": {"num_generations": 1}}, "num_generations must be >= 2 .*; got generate.num_generations=1$"),
    ({"train": {"max_staleness": -1}}, "train.max_staleness must be >= 0; got train.max_staleness=-1$"),
    ({"servers": {"concurrency": 0}}, "servers.concurrency must be >= 1; got servers.concurrency=0$"),
    ({"score": {"reward_weights": [1.0]}}, r"same length; got score.reward_funcs=\['burstrl.rl.rewards.exact_match', "
                                           r"'burstrl.rl.rewards.digit_match'\], score.reward_weights=\[1.0\]$"),
    ({"train": {"nonsense": 1}}, "nonsense"),
    ({"train": {"is_mode": "token"}}, "train.is_mode is 'token', expected one of token_truncate, token_mask"),
    ({"score": {"scale_rewards": True}}, "score.scale_rewards is 'True', expected one of group, batch, none"),
    ({"train": {"kl_estimator": "k2"}}, "would bias it: set train.kl_ratio_correction to false"),
    ({"train": {"is_cap": 0.5}}, "need 0 <= train.is_floor <= 1 <= train.is_cap; got train.is_floor=0.0, "
                                 "train.is_cap=0.5$"),
    ({"launch": {"strategy": "zero3"}}, "launch.strategy is 'zero3', expected one of ddp, fsdp, deepspeed_zero2"),
    ({"launch": {"processes": -1}}, "launch.processes must be >= 0"),
    ({"generate": {"seed": -1}}, "generate.seed must be >= 0; got generate.seed=-1"),
    ({"generate": {"min_tokens": 6}}, "need 0 <= generate.min_tokens <= generate.max_tokens"),
    ({"rent": {"provider": "aws"}}, "rent.provider is 'aws', expected one of runpod, static"),
    ({"rent": {"reserve_minutes": 600.0}}, "rent.reserve_minutes must be shorter than rent.max_hours"),
    ({"sync": {"quantize": "gptq"}}, "set inference.dtype to float16 or bfloat16, not float32"),
    ({"sync": {"quantize": "awq"}}, "sync.quantize is 'awq', expected one of none, gptq"),
    ({"servers": {"policy": ["mi50-a:8000"]}}, "servers.policy: 'mi50-a:8000' is not a base URL"),
    ({"score": {"reward_funcs": ["burstrl.rl.rewards.judge"], "reward_weights": [1.0], "judge": {"model": "v"}}},
     "burstrl.rl.rewards.judge: it needs score.judge.model and servers.reward"),
    ({"servers": {"wait_seconds": 0}}, "servers.wait_seconds must be > 0"),
])
def test_bad_params_are_named(tmp_path, change, message):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for section, values in change.items():
        params[section].update(values)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises((ConfigError, ConfigKeyError), match=message):
        load_config(tmp_path / "params.yaml")


def test_typed_defaults_equal_params_yaml():
    assert load_config(REPO / "params.yaml") == Config()


def test_the_eight_gpu_profile_shards_over_every_gpu_of_the_pod(tmp_path):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        composed = compose(config_name="config", overrides=["hardware=h200x8"])
    (tmp_path / "params.yaml").write_text(OmegaConf.to_yaml(composed))
    cfg = load_config(tmp_path / "params.yaml")
    assert (cfg.launch.processes, cfg.launch.strategy, cfg.rent.runpod.gpu_count) == (0, "fsdp", 8)
    assert (cfg.train.device, cfg.train.precision) == ("cuda", "bf16")
