"""geodbk: calibrated, non-stationary maps of mobile internet quality.

Data flows one way: ingest -> dataset -> model -> grids -> apps/export.
"""

__version__ = "0.1.0"
