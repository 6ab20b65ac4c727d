"""Config kinds are found through the package's entry points (group ``postcast.config_kinds``), not through a
list of modules the CLI imports first: every ``kind:`` of a preset in configs/ resolves in a fresh process,
every ``@config.register`` has its entry point, and an unknown kind is answered with the known ones."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("cli", "datasets", "models", "compression", "pipeline", "serve")

# run in a new process: nothing but the config module imported, so each kind is found through its entry point
RESOLVE = """
import json, sys
from postcast.datasets.core import config
before = sorted(config._KINDS)
kinds = {}
for name in sys.argv[1:]:
    cls = config.kind(name)
    kinds[name] = None if cls is None else f"{cls.__module__}.{cls.__qualname__}"
points = {name: ep.load() is config._KINDS.get(name) for name, ep in config._entry_points().items()}
print(json.dumps({"before": before, "kinds": kinds, "points": points}))
"""


def _preset_kinds() -> dict[str, str]:
    """``{preset path: kind}`` of every YAML preset in configs/ that has a ``kind:``."""
    found = {}
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict) and "kind" in data:
            found[str(path.relative_to(ROOT))] = data["kind"]
    return found


def _registered_in_source() -> dict[str, str]:
    """``{kind: file}`` of every class decorated ``@config.register("<kind>")`` in the package's folders."""
    found = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef):
                    continue
                for deco in node.decorator_list:
                    if (
                        isinstance(deco, ast.Call)
                        and isinstance(deco.func, ast.Attribute)
                        and deco.func.attr == "register"
                        and isinstance(deco.func.value, ast.Name)
                        and deco.func.value.id == "config"
                        and deco.args
                        and isinstance(deco.args[0], ast.Constant)
                    ):
                        found[deco.args[0].value] = str(path.relative_to(ROOT))
    return found


def _resolve(names: list[str]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", RESOLVE, *names], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_kind_in_configs_resolves():
    presets = _preset_kinds()
    assert {"synth", "ingest", "pipeline"} <= set(presets.values()), presets
    res = _resolve(sorted(set(presets.values())))
    assert res["before"] == []  # no kind registered by an import: each found through its entry point
    unresolved = {path: kind for path, kind in presets.items() if res["kinds"][kind] is None}
    assert unresolved == {}, f"kinds without an entry point in pyproject.toml: {unresolved}"


def test_every_registered_kind_has_its_entry_point():
    """A new ``@config.register("x")`` needs ``x = "module:Class"`` under [project.entry-points."postcast.
    config_kinds"] in pyproject.toml (then reinstall: pip install -e .); the entry point loads that class."""
    registered = _registered_in_source()
    assert {"synth", "ingest", "pipeline"} <= set(registered), registered
    points = _resolve([])["points"]
    assert set(points) == set(registered), (sorted(points), registered)
    assert all(points.values()), f"entry points whose class is not the one registered under their name: {points}"


def test_unknown_kind_names_the_known_kinds(cli, tmp_path):
    preset = tmp_path / "odd.yaml"
    preset.write_text("kind: sythn\nseed: 1\n")
    proc = cli("config", "validate", str(preset))
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"{preset}: INVALID") and "'sythn'" in line, line
    assert all(f"'{kind}'" in line for kind in ("synth", "ingest", "pipeline")), line
