"""bench_consolidation.py's own parts: `report` (summary rows, per-stack footprints, its docs
section)."""
