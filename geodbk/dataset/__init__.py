"""Datasets: tiles clipped to a region and tagged urban/rural, with quarters, splits, and the
coordinate transforms and input space that models see.
"""
