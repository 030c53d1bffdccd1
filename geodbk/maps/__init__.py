"""Maps: regular grids over a region, block-wise prediction into CF xarray datasets, the grid schema,
thresholds, reference points and polygon summaries.
"""
