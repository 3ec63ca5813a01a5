"""Queueing models as pure functions over numbers: operational laws and
bounds, single queues (M/M/1, M/M/m, M/M/m/B, M/G/1), networks (exact and
approximate MVA, multi-class MVA, open Jackson networks) and 2^k r factorial
designs. No I/O here; `mwlab.fit` applies them to measurements."""

from mwlab.models.errors import ModelError

__all__ = ["ModelError"]
