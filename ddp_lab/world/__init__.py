"""The rank's world: who it is and what it runs on.

`env` (rank, local rank, world, node, from any launcher), `distributed` (the process
group: backend, device, bounded timeouts; DistContext), `topology` (intra-node,
cross-node and leaders' groups), `cpu` (threads and how they wait), `hang` (what a hung
rank leaves), `fingerprint` (versions, CPU, threads, network), `ports` (free ports, probes).
"""
