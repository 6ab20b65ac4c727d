"""ENS-10 data foundation: schema, synthetic data, reading, normalising, ingesting, statistics."""
