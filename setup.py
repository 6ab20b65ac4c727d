"""postcast's packages, found from its folders: no hand-kept list can leave a sub-package out of the wheel.

The layers are installed under other names (``cli/`` is the package ``postcast``, ``datasets/`` is
``postcast.datasets``, ...: the layout docs/architecture.md describes). Every folder below a layer that
holds Python files is a package of the wheel; ``tests/test_packaging.py`` builds the wheel, installs it
into a new virtual environment and imports every module.
"""

from pathlib import Path

from setuptools import setup

ROOT = "cli"  # the package `postcast`
LAYERS = ("datasets", "models", "compression", "pipeline", "serve")  # `postcast.<layer>`


def _packages(layer: str) -> list[str]:
    """``postcast.<layer>`` and every folder below it that holds a Python file, as dotted names."""
    base = Path(__file__).parent / layer
    folders = {p.parent for p in base.rglob("*.py") if "__pycache__" not in p.parts}
    return sorted("postcast." + ".".join(f.relative_to(base.parent).parts) for f in folders)


setup(
    packages=["postcast", *(name for layer in LAYERS for name in _packages(layer))],
    package_dir={"postcast": ROOT, **{f"postcast.{layer}": layer for layer in LAYERS}},
    package_data={
        "postcast": ["py.typed"],
        "postcast.serve": ["static/*"],  # the forecast page's HTML, script and style
        "postcast.pipeline.products": ["geo/*.npz"],  # the coastline (pipeline/products/maps.py)
    },
)
