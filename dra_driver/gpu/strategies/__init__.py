"""Ways of preparing a GPU, each one implementation of :class:`base.SharingStrategy`.

:mod:`.base` is the seam (the protocol and its optional abilities; the registry is
:class:`~dra_driver.gpu.planning.Strategies`);
:mod:`.builtin` registers the built-in strategies, one module each. A new way is a
new module here and one more line in :data:`builtin.BUILTIN`.
"""
