"""Ingest: Ookla open-data tiles (quadkeys, schema), fetching and caching remote sources,
regions, Census urban/rural areas and the UCI benchmark sets.

Nothing here knows about datasets, models or maps.
"""
