"""Each stage's deps in dvc.yaml cover the code it runs, read from its imports (burstrl.pipeline.deps)."""

import importlib.util
import shutil
from pathlib import Path

import pytest
from conftest import REPO

from burstrl.pipeline.deps import closure, missing


def test_every_stage_lists_the_code_it_runs():
    assert missing(REPO / "dvc.yaml", REPO) == {}


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "stages").glob("*.py")))
def test_each_stage_script_imports_what_it_names(script):
    # A name moved between modules breaks a stage only when dvc runs it; importing the script (its body is
    # under `if __name__ == "__main__"`) finds that here.
    spec = importlib.util.spec_from_file_location(f"stage_{script[:-3]}", REPO / "stages" / script)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_the_closure_follows_imports_packages_and_python_m_strings(tmp_path):
    (tmp_path / "stages").mkdir()
    (tmp_path / "burstrl/sub").mkdir(parents=True)
    (tmp_path / "stages/one.py").write_text("from burstrl.sub import a\nimport json\n")
    for name, text in {"__init__.py": "", "sub/__init__.py": "", "unused.py": "",
                       "sub/a.py": "from burstrl.sub.b import f\n\ndef g():\n    from burstrl import c\n",
                       "sub/b.py": 'def f():\n    return ["python", "-m", "burstrl.d", "burstrl.c.not_a_module"]\n',
                       "c.py": "", "d.py": ""}.items():
        (tmp_path / "burstrl" / name).write_text(text)
    assert closure(Path("stages/one.py"), tmp_path) == [
        "burstrl/__init__.py", "burstrl/c.py", "burstrl/d.py", "burstrl/sub/__init__.py", "burstrl/sub/a.py",
        "burstrl/sub/b.py", "stages/one.py"]


def test_a_dep_left_out_is_named_with_its_stage_and_a_folder_or_a_reasoned_comment_covers_it(tmp_path):
    for name in ("stages", "burstrl"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    text = (REPO / "dvc.yaml").read_text()
    assert "        - burstrl/pipeline/resume.py\n" in text  # generate, score and train list it
    (tmp_path / "dvc.yaml").write_text(text.replace("        - burstrl/pipeline/resume.py\n", "", 1))
    assert missing(tmp_path / "dvc.yaml", tmp_path) == {"generate": ["burstrl/pipeline/resume.py"]}
    folder = text.replace("        - burstrl/pipeline/resume.py\n", "        - burstrl/pipeline\n", 1)
    (tmp_path / "dvc.yaml").write_text(folder)
    assert missing(tmp_path / "dvc.yaml", tmp_path) == {}
    (tmp_path / "dvc.yaml").write_text("# not a dep of generate: burstrl/pipeline/resume.py (a test)\n"
                                       + text.replace("        - burstrl/pipeline/resume.py\n", "", 1))
    assert missing(tmp_path / "dvc.yaml", tmp_path) == {}
    # A new import in a stage script is a new dep.
    script = tmp_path / "stages/eval.py"
    script.write_text(script.read_text() + "\nfrom burstrl.reporting import history  # noqa: E402,F401\n")
    (tmp_path / "dvc.yaml").write_text(text)
    assert missing(tmp_path / "dvc.yaml", tmp_path) == {
        "eval": ["burstrl/pipeline/catalog.py", "burstrl/reporting/__init__.py", "burstrl/reporting/history.py"]}


# The package's folders, lowest first: a module imports only from its own layer or lower ones (docs/architecture.md).
LAYERS = [("errors", "config", "atomic"), ("data",), ("pipeline",), ("inference",), ("env",), ("rl",), ("training",),
          ("remote",), ("reporting",)]


def test_imports_only_go_down_the_layers():
    rank = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    upward = []
    for path in sorted((REPO / "burstrl").rglob("*.py")):
        part = path.relative_to(REPO / "burstrl").parts[0].removesuffix(".py")
        if part in ("__init__", "__main__"):
            continue
        for dep in closure(path.relative_to(REPO), REPO):
            dep_part = Path(dep).parts[1].removesuffix(".py") if dep.startswith("burstrl/") else None
            if dep_part in rank and rank[dep_part] > rank[part]:
                upward.append(f"{path.relative_to(REPO)} -> {dep}")
    assert upward == []
