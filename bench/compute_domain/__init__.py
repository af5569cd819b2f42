"""``python -m bench.compute_domain``: one ComputeDomain across ``--nodes`` kubelet-less
nodes on the fleet bench's control plane (its client QPS for kube-scheduler and
kube-controller-manager), from the domain's creation to every workload claim allocated
and every node's IMEX daemon Ready in its clique object.

    python -m bench.compute_domain --nodes 16
    python -m bench.compute_domain --nodes 256 --clique-size 18 -o json

The real controller runs (``dra-driver compute-domain-controller``, its own process).
Every node publishes what the compute-domain kubelet plugin publishes (``channel-0``
and ``daemon-0`` with its clique); ``--nodes`` workload pods claim a channel from the
domain's template, so the scheduler places one per node. What the nodes would write is
played here, per node, as soon as its trigger is seen: a workload pod bound to a node
labels the node (the plugin's prepare), and a daemon pod bound to a node gets its clique
label (the daemon) and Ready with an IP (the kubelet). Writes and 409s are the API
server's own counts (``apiserver_request_total``, every client), and the controller's.
Where the time went: ``stages_s`` (first and last node labelled, daemon pod seen, daemon
pod bound) and ``cpu_s`` (CPU seconds of each control-plane process, the controller and
the bench itself in the timed window); ``--controller-log`` keeps the controller's log.
"""
