"""The ComputeDomain controller: per domain, the workload and daemon ResourceClaimTemplates,
the IMEX daemons' DaemonSet, the clique objects and the domain's status (issue 44).

Reading order: :mod:`.controller` (wiring, workers), :mod:`.reconciling` (one domain,
level-triggered), :mod:`.objects` and :mod:`.cliques` (pure: what should exist),
:mod:`.informers` and :mod:`.workqueue` (list+watch caches, keys to do),
:mod:`.kubeapi` (the only module that talks to the API server).
"""
