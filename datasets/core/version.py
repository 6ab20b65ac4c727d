"""postcast's version: one definition, read by the package metadata, stores, forecast files and the service."""

__version__ = "0.1.0"
