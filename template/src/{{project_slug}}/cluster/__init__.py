"""Nodes and processes: the node launcher (the Topology settings/topology.py reads from the platform),
torchrun and its rendezvous, supervision, the fabric settings, the ranks on this machine, and the
check of a ready-made image that runs the project's copy from storage.
"""
