"""postcast: post-processing of ensemble weather forecasts (ENS-10).

Subpackages (imports go one way: datasets <- models/compression <- pipeline <- serve; the CLI on top):

- ``postcast.datasets``: ENS-10 schema, synthetic generator, readers/writers, ingestion, statistics.
- ``postcast.models``: post-processors and losses.
- ``postcast.compression``: neural field compression.
- ``postcast.pipeline``: staged pipeline, evaluation, batch forecast.
- ``postcast.serve``: HTTP forecast service.
"""

import os

# torch's OpenMP threads sleep at a barrier instead of spinning 300,000 times first (libgomp's default): beside
# other work a 2-thread EMOS fit spent its time slices spinning (9.6x its time alone beside 2 busy processes;
# 1.84x sleeping: docs/scale.md). Read when torch loads its OpenMP runtime, so only where postcast is imported
# before torch; a policy the user set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from postcast.datasets.core.version import __version__

__all__ = ["__version__"]
