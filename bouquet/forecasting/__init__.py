"""Forecasting without a model: the naive forecasters every water result stands beside, the rule that combines a
model with its baseline, and the statistics that compare forecasters over households.

Pure numpy (and scipy for the t distribution); no torch, no Flower.  The field's libraries (statsforecast,
mlforecast, utilsforecast) are used by the studies through :mod:`bouquet.forecasting.baselines`, an optional
extra (``pip install "bouquet-fl[forecasting]"``); the nodes keep these small forecasters, which a test shows
equal to statsforecast's to 1e-9.
"""

from bouquet.forecasting.combine import COMBINATION_WEIGHTS, FALLBACKS, FallbackParams, choose_weight, combine
from bouquet.forecasting.naive import NAIVE_FORECASTERS, NaiveParams, blend_weight, naive_forecasts

__all__ = ["COMBINATION_WEIGHTS", "FALLBACKS", "NAIVE_FORECASTERS", "FallbackParams", "NaiveParams", "blend_weight",
           "choose_weight", "combine", "naive_forecasts"]
