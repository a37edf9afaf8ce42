"""The run history from metrics files, the HTML report (rendered by headless Chromium), the terminal table,
the rollout inspector and the stage log files."""

import json
import re
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, screenshot

from burstrl.config import CostConfig
from burstrl.pipeline.catalog import CHARTS, PLOTS
from burstrl.reporting.charts import COLORS, render
from burstrl.reporting.history import collect, sessions, summary
from burstrl.reporting.rollouts import choose, describe
from burstrl.reporting.table import render as render_table

COST = CostConfig(train_usd_per_hour=3.6, inference_usd_per_hour=0.36)


def write_run(root, iterations=1):
    def put(path, data):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))

    put(root / "metrics/eval/000.json", {"heldout_accuracy": 0.3})
    put(root / "metrics/bootstrap.json", {"seconds": 36})
    put(root / "metrics/train/009.json", {"seconds": 99})  # a removed iteration's leftover: not in the history
    for i in range(1, iterations + 1):
        v = f"{i:03d}"
        put(root / f"metrics/generate/{v}.json", {"completion_length_mean": 3.0 + i, "seconds": 20})
        put(root / f"metrics/score/{v}.json", {"reward_mean": 0.5 + 0.1 * i,
                                               "reward/burstrl.rl.rewards.exact_match": 0.25, "seconds": 30})
        put(root / f"metrics/train/{v}.json", {
            "kl": 0.01 * i, "sampler_kl": 0.002 * i, "quantization_kl": 0.002 * i, "staleness_kl": 0.0,
            "entropy": 1.5, "is_weight_mean": 0.99, "seconds": 10,
            "staleness": {"0": 2, "1": 2}, "rows_kept": 3, "rows_dropped_stale": 1, "rows_dropped_zero_variance": 0,
            "rows_masked_truncated": 0,
        })
        put(root / f"metrics/eval/{v}.json", {"heldout_accuracy": 0.3 + 0.05 * i, "seconds": 40})
        put(root / f"data/sync/{v}.json", {"seconds": 10})


def test_history_rows_and_cost_by_hand(tmp_path):
    write_run(tmp_path)
    rows = collect(tmp_path / "metrics", tmp_path / "data/sync", COST, ["001"])
    assert [r["iteration"] for r in rows] == [0, 1]
    # bootstrap: 36 s of warm-up at the training GPU's $3.6/h
    assert rows[0]["heldout_accuracy"] == 0.3 and rows[0]["cost_usd"] == pytest.approx(0.036)
    assert rows[0].keys() == rows[1].keys() and rows[0]["reward/burstrl.rl.rewards.exact_match"] is None
    one = rows[1]
    assert one["reward/burstrl.rl.rewards.exact_match"] == 0.25 and one["staleness_mean"] == 0.5
    assert one["rows_dropped"] == 1
    # train 10 s at $3.6/h = $0.01; generate + score + eval + sync = 100 s at $0.36/h = $0.01
    assert one["cost_usd"] == pytest.approx(0.02) and one["cost_usd_total"] == pytest.approx(0.056)
    facts = summary(rows)
    assert facts["heldout_accuracy"] == pytest.approx(0.35) and facts["heldout_accuracy_gain"] == pytest.approx(0.05)
    assert facts["hours_total"] == pytest.approx((36 + 110) / 3600)


def test_a_run_with_episodes_charts_tool_use_and_a_run_without_has_no_such_columns(tmp_path):
    write_run(tmp_path)
    plain = collect(tmp_path / "metrics", tmp_path / "data/sync", COST, ["001"])
    assert "tool_use_rate" not in plain[1] and "Held-out tool use" not in render(plain, summary(plain), {})
    put = (tmp_path / "metrics/generate/001.json"), (tmp_path / "metrics/eval/001.json")
    put[0].write_text(json.dumps({"seconds": 20, "rollouts": 8, "turns_mean": 1.5, "tool_calls": 6, "tool_errors": 2}))
    put[1].write_text(json.dumps({"heldout_accuracy": 0.4, "tool_use_rate": 0.25, "accuracy_with_tool": 0.8,
                                  "accuracy_without_tool": 0.2, "seconds": 40}))
    rows = collect(tmp_path / "metrics", tmp_path / "data/sync", COST, ["001"])
    assert {k: rows[1][k] for k in ("turns_mean", "tool_calls_per_episode", "tool_errors_per_episode",
                                    "tool_use_rate", "accuracy_with_tool")} == {
        "turns_mean": 1.5, "tool_calls_per_episode": 0.75, "tool_errors_per_episode": 0.25, "tool_use_rate": 0.25,
        "accuracy_with_tool": 0.8}
    assert rows[0]["tool_use_rate"] is None  # the bootstrap row has no eval of its episodes in this run
    page = render(rows, summary(rows), {})
    assert 'aria-label="Held-out tool use and accuracy' in page and 'aria-label="Per sampled episode' in page


def test_non_finite_values_become_null_and_are_not_drawn(tmp_path):
    write_run(tmp_path)
    path = tmp_path / "metrics/train/001.json"
    path.write_text(path.read_text().replace('"kl": 0.01', '"kl": NaN'))
    rows = collect(tmp_path / "metrics", tmp_path / "data/sync", COST, ["001"])
    assert rows[1]["kl_ref"] is None
    page = render(rows, summary(rows), {})
    assert "no data yet" not in page
    # Drawn, a NaN would be a coordinate or a cell of the table; the one page of this run has none anywhere.
    assert "nan" not in page.lower()
    kl_chart = page[page.index('aria-label="KL to the reference'):]
    kl_chart = kl_chart[:kl_chart.index("</svg>")]
    assert kl_chart.count("<circle") == 1  # sampler_kl's one point; kl_ref has none to draw


def test_terminal_table_shows_missing_cells_as_dashes(tmp_path):
    write_run(tmp_path)
    lines = render_table(collect(tmp_path / "metrics", tmp_path / "data/sync", COST, ["001"])).splitlines()
    assert lines[0].split() == ["iter", "reward", "heldout_acc", "kl_ref", "kl_samp", "compl_len", "s_gen", "s_score",
                                "s_train", "s_eval", "usd"]
    assert lines[1].split() == ["000", "-", "0.300"] + ["-"] * 7 + ["0.0360"]
    assert lines[2].split()[:5] == ["001", "0.600", "0.350", "0.0100", "0.0020"]


def test_report_draws_every_chart_and_says_when_there_is_no_data(tmp_path):
    write_run(tmp_path)
    rows = collect(tmp_path / "metrics", tmp_path / "data/sync", COST, ["001"])
    page = render(rows, summary(rows), {"train": {"beta": 0.02}})
    # The charts are those of `dvc plots show` (dvc.yaml's top-level plots) plus the running cost, in that order.
    plots = [next(iter(plot)) for plot in yaml.safe_load((REPO / "dvc.yaml").read_text())["plots"]]
    assert re.findall(r'<svg class="chart"[^>]*aria-label="([^"]*)"', page) == [*plots, "Cost so far (USD)"]

    assert "<polyline" in page
    assert "&quot;beta&quot;: 0.02" in page
    assert "no data yet" in render(rows[:1], summary(rows[:1]), {})


def test_dvc_yaml_plots_are_the_catalogs():
    declared = [(title, spec["y"]["report/history.json"]) for plot in yaml.safe_load((REPO / "dvc.yaml").read_text())
                ["plots"] for title, spec in plot.items()]
    assert declared == PLOTS and [title for title, _ in CHARTS] == [t for t, _ in PLOTS] + ["Cost so far (USD)"]


def test_report_renders_in_headless_chromium(tmp_path):
    write_run(tmp_path, iterations=4)
    rows = collect(tmp_path / "metrics", tmp_path / "data/sync", COST, ["001", "002", "003", "004"])
    page = tmp_path / "index.html"
    page.write_text(render(rows, summary(rows), {}))
    pixels = screenshot(page, tmp_path / "shot.png")
    # Each series colour appears as a drawn line with markers, in more than a few hundred pixels.
    for color in COLORS[:2]:
        rgb = tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))
        assert sum(p == rgb for p in pixels) > 300, f"series colour {color} not drawn"
    assert sum(p == (255, 255, 255) for p in pixels) < 0.95 * len(pixels)


def test_inspect_shows_each_token_with_its_weights():
    row = {"prompt_id": 3, "sample_index": 1, "reward": 1.5, "rewards": [1.0, 0.5], "advantage": 0.75,
           "finish_reason": "stop", "policy_version": "001", "sampler_weights": "checkpoint", "prompt": "1+1=",
           "completion": "2", "completion_ids": [7, 2], "completion_mask": [1, 1], "sampler_logprobs": [-0.5, -0.25],
           "ref_logprobs": None, "completion_messages": None}
    weights = {"staleness": 1, "keep": True, "proximal_logprobs": [-0.4, -0.2], "is_weights": [1.105, 1.051]}
    text = describe(row, weights, ["burstrl.rl.rewards.exact_match", "m.digit_match"], {7: "2", 2: "<eos>"}.get)
    lines = text.splitlines()
    assert "reward 1.500 (exact_match 1.0, digit_match 0.5), advantage +0.750" in lines[0]
    assert "staleness 1, used" in lines[0]
    assert lines[4].split() == ["'2'", "1", "-0.500", "-0.400", "-", "1.105"]
    rows = [{"prompt_id": 1, "reward": r} for r in (0.2, 0.9, 0.5)] + [{"prompt_id": 2, "reward": 0.1}]
    assert choose(rows, 2, lowest=False, prompt_id=None) == [1, 2]
    assert choose(rows, 1, lowest=True, prompt_id=None) == [3]
    assert choose(rows, 1, lowest=False, prompt_id=1) == [0, 1, 2]


def test_inspect_shows_an_episode_turn_by_turn_with_its_mask():
    row = {"prompt_id": 0, "sample_index": 0, "reward": 1.0, "rewards": [1.0], "advantage": 0.5,
           "finish_reason": "stop", "policy_version": "001", "sampler_weights": "checkpoint", "prompt": "1+2+3=",
           "completion": "[..](3)|6", "completion_ids": [40, 2, 30, 31, 6, 2], "completion_mask": [1, 1, 0, 0, 1, 1],
           "sampler_logprobs": [-0.5, -0.1, None, None, -0.2, -0.3],
           "ref_logprobs": [-0.6, -0.1, -3.0, -2.0, -0.2, -0.3],
           "completion_messages": "[]", "num_turns": 2, "tool_calls": 1, "tool_errors": 0, "env_reward": None}
    weights = {"staleness": 0, "keep": True, "proximal_logprobs": [-0.5, -0.1, -2.9, -2.1, -0.2, -0.3],
               "is_weights": [1.0] * 6}
    lines = describe(row, weights, ["m.exact_match"], {40: "[", 2: "<eos>", 30: "(", 31: "3", 6: "6"}.get).splitlines()
    assert lines[1] == "  episode: 2 turns, 1 tool calls, 0 errors"
    body = lines[5:]
    assert [line.strip() for line in body if line.startswith("  --")] == ["-- turn 1: model", "-- tool result",
                                                                       "-- turn 2: model"]
    # A tool-result token: mask 0, no sampler logprob, no importance weight (it is no term of the loss).
    assert body[4].split() == ["'('", "0", "-", "-2.900", "-3.000", "-"]


def test_stage_output_also_goes_to_its_log_file(tmp_path):
    script = ("import sys, subprocess; from burstrl.pipeline.stage import parse; args, cfg = parse('d', 'iteration'); "
              "print('to stdout'); print('to stderr', file=sys.stderr); "
              "subprocess.run(['echo', 'from a child'])")
    done = subprocess.run([sys.executable, "-c", script, "007", "--params", str(REPO / "params.yaml")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "to stdout\nfrom a child\n" and done.stderr == "to stderr\n"
    log = (tmp_path / "logs/-c/007.log").read_text()
    assert log.startswith("==== ") and all(s in log for s in ("to stdout", "to stderr", "from a child"))


def test_report_splits_each_rented_session_by_what_each_side_was_doing(tmp_path):
    write_run(tmp_path)
    rows = collect(tmp_path / "metrics", tmp_path / "data/sync", COST, ["001"])
    assert sessions(tmp_path / "metrics") == [] and "no rented session yet" in render(rows, summary(rows), {})
    session = {"id": "20261206-101500-abcdef", "iterations_trained": ["001", "002"], "wall_seconds": 700.0,
               "rented": {"setup_seconds": 100.0, "training_seconds": 400.0, "syncing_seconds": 50.0,
                          "waiting_for_home_seconds": 120.0, "teardown_seconds": 10.0, "total_seconds": 680.0},
               "home": {"generate_seconds": 300.0, "score_seconds": 200.0, "eval_seconds": 40.0, "sync_seconds": 20.0,
                        "waiting_for_trainer_seconds": 140.0},
               "usd": 0.68, "usd_per_iteration": 0.34, "gpu_hours_per_iteration": 0.0944}
    (tmp_path / "metrics/session").mkdir()
    (tmp_path / "metrics/session/20261206-101500-abcdef.json").write_text(json.dumps(session))
    [row] = sessions(tmp_path / "metrics")
    assert row["iterations"] == 2 and row["rented_syncing_seconds"] == 50.0 and row["home_score_seconds"] == 200.0
    # The rented side's parts add up to its total: 100 + 400 + 50 + 120 + 10 = 680.
    assert sum(row[f"rented_{k}_seconds"] for k in ("setup", "training", "syncing", "waiting_for_home",
                                                     "teardown")) == row["rented_seconds"]
    page = render(rows, summary(rows), {}, [row])
    table = page[page.index('<table class="sessions">'):]
    table = table[:table.index("</table>")]
    assert "<th>rented_waiting_for_home_seconds</th>" in table and "<td>20261206-101500-abcdef</td>" in table
    assert table.count("<tr>") == 2 and "<td>0.0944</td>" in table
