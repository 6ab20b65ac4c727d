"""postcast: post-processing of ensemble weather forecasts (ENS-10).

Subpackages (imports go one way: datasets <- models/compression <- pipeline <- serve; the CLI on top):

- ``postcast.datasets``: ENS-10 schema, synthetic generator, readers/writers, ingestion, statistics.
- ``postcast.models``: post-processors and losses.
- ``postcast.compression``: neural field compression.
- ``postcast.pipeline``: staged pipeline, evaluation, batch forecast.
- ``postcast.serve``: HTTP forecast service.
"""

from postcast.datasets.core.version import __version__

__all__ = ["__version__"]
