"""Static checks and estimates over the Tile IR: races, bank conflicts, the roofline.

``tesserac check`` runs the checks (``checks.check_module``); the estimates go into
``--emit meta`` and the lowering inspector. The package imports none of its modules, so
that a compilation loads only the estimates it writes into the metadata.
"""
