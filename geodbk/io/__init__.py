"""Export: GeoTIFF/COG, NetCDF and Zarr of finished grids, and vector files of tile predictions.
"""
