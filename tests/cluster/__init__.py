"""Tests against the real control plane (tiers T2/T3): etcd, kube-apiserver, scheduler, KCM."""
