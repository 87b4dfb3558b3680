"""Writes customers.csv: iris rows with a species name and one of five customers (fixed seed, no
download)."""

from pathlib import Path

import numpy as np
from sklearn.datasets import load_iris

iris = load_iris(as_frame=True)
frame = iris.frame.rename(columns=lambda c: c.replace(" (cm)", "").replace(" ", "_"))
frame["species"] = [iris.target_names[i] for i in frame.pop("target")]
frame.insert(
    0, "customer", [f"customer-{i}" for i in np.random.default_rng(0).integers(0, 5, len(frame))]
)
frame.to_csv(Path(__file__).with_name("customers.csv"), index=False)
