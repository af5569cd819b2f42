"""The node side of ComputeDomains: the ``compute-domain.nvidia.com`` kubelet plugin's
backend (:mod:`.backend`) and the IMEX daemon a domain runs on each of its nodes
(:mod:`.imexdaemon`)."""
