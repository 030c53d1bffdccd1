"""Export and reading of finished grids: GeoTIFF/COG, NetCDF and Zarr, vector files of tile
predictions, and the ``.dbk`` accessor, whose :class:`~geodbk.io.reader.GridReader` is the one
reader of the grid format.
"""
