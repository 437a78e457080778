"""Helpers that know nothing of models: atomic files and cache folders, units, plots, timing.

The bottom layer of the package: nothing here imports the rest of llamablock, so every layer
above (the module's files included) may use it.
"""
