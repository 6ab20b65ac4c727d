"""mypy reads the package as installed through scripts/typecheck/postcast/ (pyproject.toml [tool.mypy]), a tree
of relative links: a cli module without its link is not type-checked at all, and nothing else would say so.
scripts/typecheck.sh makes the links (and runs mypy); this test fails when one is missing or dangles."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "scripts" / "typecheck" / "postcast"
LAYERS = ("datasets", "models", "compression", "pipeline", "serve")


def missing_links(root: Path) -> list[str]:
    """The cli files and layer folders without a link in the tree that resolves to them, and the tree's
    dangling links."""
    tree = root / "scripts" / "typecheck" / "postcast"
    wanted = [*sorted((root / "cli").glob("*.py")), root / "cli" / "py.typed", *(root / layer for layer in LAYERS)]
    bad = [
        f"{p.relative_to(root)}: no link"
        for p in wanted
        if not ((tree / p.name).is_symlink() and (tree / p.name).resolve() == p.resolve())
    ]
    bad += [f"{p.relative_to(root)}: dangling" for p in sorted(tree.iterdir()) if p.is_symlink() and not p.exists()]
    return bad


def test_every_cli_module_is_type_checked():
    assert missing_links(ROOT) == [], "run scripts/typecheck.sh --links and commit the links"
    assert all(os.readlink(p)[0] != "/" for p in TREE.iterdir()), "the links are relative (a clone elsewhere)"


def test_the_script_links_a_new_module_and_drops_a_removed_one(tmp_path):
    shutil.copytree(
        ROOT / "scripts", tmp_path / "scripts", symlinks=True, ignore=shutil.ignore_patterns("*.txt", "__pycache__")
    )
    shutil.copytree(ROOT / "cli", tmp_path / "cli", ignore=shutil.ignore_patterns("__pycache__"))
    for layer in LAYERS:
        (tmp_path / layer).mkdir()
    (tmp_path / "cli" / "verb_planted.py").write_text("")
    (tmp_path / "cli" / "common.py").unlink()
    assert sorted(missing_links(tmp_path)) == [
        "cli/verb_planted.py: no link",
        "scripts/typecheck/postcast/common.py: dangling",
    ]
    subprocess.run(
        ["bash", str(tmp_path / "scripts" / "typecheck.sh"), "--links"],
        check=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert missing_links(tmp_path) == []
