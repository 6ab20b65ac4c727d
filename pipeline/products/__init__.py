"""The forecast products: the files ``postcast forecast`` writes and ``postcast serve`` reads, and their maps.

``archive`` is the files' contract (layout, atomic writes, scanning and reading, the scores that rank the
models) and ``content`` the CF dataset of one predictive law each file holds; ``maps`` what every postcast map
shares (coastlines, axes, colour scales: the service's ``/map.png`` and the report's CRPS maps). They stand on
:mod:`postcast.datasets` only, no torch: the service imports them and nothing else of the pipeline
(``scripts/check_imports.py`` checks it).
"""
