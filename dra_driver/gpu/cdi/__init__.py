"""CDI: the spec model, its validation and atomic writer (:mod:`.spec`), and NVIDIA's
``nvidia-cdi-hook`` that every claim's spec names (:mod:`.hooks`).

A claim's spec is assembled one level up, in :mod:`dra_driver.gpu.cdiedits` (it
asks the sharing strategies for their edits).

May import: :mod:`dra_driver.gpu.host` only.
"""
