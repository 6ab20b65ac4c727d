"""postcast.pipeline (see the issues for what lands here)."""
