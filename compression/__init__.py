"""postcast.compression (see the issues for what lands here)."""
