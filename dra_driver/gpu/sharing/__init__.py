"""Sharing: the ways a GPU is prepared beyond handing it out whole.

:mod:`.strategies` holds one module per strategy (registered in
:mod:`.strategies.builtin`); what they drive sits beside them: the GPU tools as argv
lists (:mod:`.tools`), MPS control daemons (:mod:`.mpsdaemons`, run by
:mod:`.mpsrunners`, started through :mod:`.mpslaunch`), dynamic MIG instances
(:mod:`.miginstances`), fractional shares (:mod:`.shares`) and MPS slots
(:mod:`.slots`).

May import: :mod:`dra_driver.gpu.planning` (targets, the strategy protocols),
:mod:`~dra_driver.gpu.checkpoint`, :mod:`~dra_driver.gpu.config` and the rooms below
(hardware, cdi, host). Never the claim pipeline, the state file or health.
"""
