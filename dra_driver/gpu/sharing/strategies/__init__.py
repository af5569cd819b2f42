"""Ways of preparing a GPU, each one implementation of
:class:`~dra_driver.gpu.planning.SharingStrategy`.

:mod:`.base` is the seam's contract (what a strategy does, :class:`~.base.NodeTools`,
:class:`~.base.Materializes`); the protocol and its optional abilities sit in
:mod:`dra_driver.gpu.planning`, which asks them, with the registry
:class:`~dra_driver.gpu.planning.Strategies`. :mod:`.builtin` registers the built-in
strategies, one module each. A new way is a new module here and one more line in
:data:`builtin.BUILTIN`.
"""
