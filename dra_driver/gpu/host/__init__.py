"""The host beneath everything: where its files are (:mod:`.hostpaths`, so emulation
and tests can move them) and how small files are written and locked (:mod:`.files`).

May import: nothing of the GPU layer (only :mod:`dra_driver.errors`).
"""
