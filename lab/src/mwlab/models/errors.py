"""The one exception the models raise."""


class ModelError(ValueError):
    """Inputs a model cannot take (outside the stable region, negative rates, ...)."""
