"""postcast.serve (see the issues for what lands here)."""
