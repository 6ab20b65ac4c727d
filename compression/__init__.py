"""Neural-field compression of gridded fields: a coordinate network per set of fields, stored as one
self-describing artefact, with an optional SZ3 layer that bounds the error.

Modules: ``field`` (the network and its fit), ``artefact`` (the ``.pcnf`` file and its decode),
``sz3`` (the one wrapper around pysz), ``baselines`` (SZ3 and ZFP on the same arrays), ``metrics``
and ``report`` (errors and the comparison table), ``loader`` (training post-processors from an
artefact). Design and measurements: docs/compression.md.
"""
