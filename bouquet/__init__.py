"""bouquet: heterogeneity-aware federated learning for Flower.

Coalition aggregation (Hegselmann-Krause opinion dynamics) and client selection
strategies, a water-meter forecasting task and the data pipeline behind it.
"""

__version__ = "0.1.0"
