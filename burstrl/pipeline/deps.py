"""The code each stage runs, read from its imports: the files dvc.yaml must list as that stage's deps.

A stage's code is its script and, transitively, every module of this repository that it imports (at the
top or inside a function) or starts with `python -m` (a string that names a module of the package, as in
a subprocess's arguments). Importing burstrl.x.y runs burstrl/__init__.py and burstrl/x/__init__.py too,
so those count. A dep that is a folder covers the files in it. dvc.yaml may leave a file out on purpose
with a comment line `# not a dep of STAGE: FILE (why)`.

`python -m burstrl.pipeline.deps` prints each stage whose deps miss files, and exits 1 if any does.
"""

import ast
import hashlib
import json
import re
import sys
from pathlib import Path

import yaml

from burstrl.data.policy import file_sha256

PACKAGE = "burstrl"
_MODULE = re.compile(rf"{PACKAGE}(\.\w+)*")
_SCRIPT = re.compile(r"\b(stages/\w+\.py)\b")
_EXEMPT = re.compile(r"^\s*#\s*not a dep of ([\w-]+):\s*(\S+)", re.M)


def module_file(name: str, root: Path) -> Path | None:
    """The file of module `name` relative to `root`, or None when it is no module of this repository."""
    parts = name.split(".")
    for candidate in (Path(*parts).with_suffix(".py"), Path(*parts, "__init__.py")):
        if (root / candidate).is_file():
            return candidate
    return None


def _named_modules(path: Path, root: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from burstrl.x import y`: y is a module or a name defined in burstrl.x; module_file tells which.
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE.fullmatch(node.value)
              and module_file(node.value, root)):  # a module started with `python -m`, not a function's dotted name
            names.add(node.value)
    return {n for n in names if n == PACKAGE or n.startswith(PACKAGE + ".")}


def closure(script: Path, root: Path = Path(".")) -> list[str]:
    """`script` and every file of this repository it runs, as paths relative to `root`, sorted."""
    seen: set[Path] = set()
    todo = [script]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _named_modules(root / path, root):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                found = module_file(".".join(parts[:i]), root)
                if found is not None and found not in seen:
                    todo.append(found)
    return sorted(str(p) for p in seen)


def code_hash(script: Path, root: Path = Path(".")) -> str:
    """The sha256 of the code `script` runs: resumable progress made by other code is not reused."""
    files = closure(script, root)
    return hashlib.sha256(json.dumps({f: file_sha256(root / f) for f in files}).encode()).hexdigest()


def missing(pipeline: Path = Path("dvc.yaml"), root: Path = Path(".")) -> dict[str, list[str]]:
    """Per stage of `pipeline`, the files its script runs that its deps do not cover; stages that miss none
    are left out."""
    text = pipeline.read_text()
    exempt: dict[str, set[str]] = {}
    for stage, path in _EXEMPT.findall(text):
        exempt.setdefault(stage, set()).add(path)
    result = {}
    for stage, definition in yaml.safe_load(text)["stages"].items():
        body = definition.get("do", definition)
        script = _SCRIPT.search(body["cmd"])
        if script is None:
            continue
        deps = [str(d).rstrip("/") for d in body.get("deps", [])]
        lacking = [f for f in closure(Path(script[1]), root) if f not in exempt.get(stage, set())
                   and not any(f == d or f.startswith(d + "/") for d in deps)]
        if lacking:
            result[stage] = lacking
    return result


if __name__ == "__main__":
    lacking = missing()
    for stage, files in lacking.items():
        print(f"dvc.yaml: stage '{stage}' runs files its deps do not list: {', '.join(files)}")
    sys.exit(1 if lacking else 0)
