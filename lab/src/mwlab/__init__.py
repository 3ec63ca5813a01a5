"""mwlab: the lab around mwproxy — results files, experiments, models."""

__version__ = "0.1.0"
