"""The full local stack for ``dra-driver demo`` and the end-to-end tests.

A real control plane (:mod:`dra_driver.devcluster`), our kubelet plugin as a
subprocess on an emulated GPU node, and the kubelet's own DRA code in the Go
kubelet harness. Developer tooling only: the driver daemon never imports it.
"""
