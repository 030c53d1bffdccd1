"""Fitting and prediction: the trainer, the fitted :class:`~geodbk.fit.regressor.Regressor` around a
zoo model, the lon/lat :class:`~geodbk.fit.geomodel.GeoModel`, the local residual field and metrics.
"""
