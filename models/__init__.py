"""postcast.models (see the issues for what lands here)."""
