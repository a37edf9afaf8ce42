"""docs/hardware.md tabulates what each hardware profile sets; `dvc exp run -S hardware=NAME` must compose a
params.yaml with exactly those values, and the typed config must accept every profile."""

import re

import pytest
import yaml
from conftest import REPO, run, scratch_workspace
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from burstrl.config import load_config


def documented() -> dict[str, dict[str, object]]:
    """{profile: {dotted param: value}} from the table of docs/hardware.md, each cell read as YAML."""
    lines = (REPO / "docs" / "hardware.md").read_text().splitlines()
    start = lines.index(next(line for line in lines if line.startswith("| param |")))
    profiles = [cell.strip() for cell in lines[start].strip("|").split("|")][1:]
    table: dict[str, dict[str, object]] = {p: {} for p in profiles}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        key, *cells = [re.sub(r"^`|`$", "", cell.strip()) for cell in line.strip("|").split("|")]
        for profile, cell in zip(profiles, cells, strict=True):
            table[profile][key] = yaml.safe_load(cell)
    return table


def lookup(params: dict, dotted: str):
    for part in dotted.split("."):
        params = params[part]
    return params


def test_the_table_covers_every_profile_of_conf():
    assert sorted(documented()) == sorted(p.stem for p in (REPO / "conf" / "hardware").glob("*.yaml"))


@pytest.mark.parametrize("profile", sorted(p.stem for p in (REPO / "conf" / "hardware").glob("*.yaml")))
def test_each_profile_loads_into_the_typed_config(tmp_path, profile):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        composed = compose(config_name="config", overrides=[f"hardware={profile}"])
    (tmp_path / "params.yaml").write_text(OmegaConf.to_yaml(composed))
    cfg = load_config(tmp_path / "params.yaml")
    assert cfg.inference.dtype == documented()[profile]["inference.dtype"]


@pytest.mark.slow
def test_dvc_exp_run_composes_the_documented_values(tmp_path):
    env = scratch_workspace(tmp_path, {}, {})
    for profile, expected in documented().items():
        run(["dvc", "exp", "run", "-S", f"hardware={profile}", "prepare"], tmp_path, env)
        params = yaml.safe_load((tmp_path / "params.yaml").read_text())
        got = {key: lookup(params, key) for key in expected}
        assert got == expected, profile
