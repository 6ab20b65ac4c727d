"""torch/Lightning adapters over the torch-free data core: the store DataModule and the clairvoyant loader.

Everything else in :mod:`postcast.datasets` imports neither torch nor Lightning; this subpackage
is the edge where samples (numpy, built by :mod:`postcast.datasets.sample`) become tensors.
"""
