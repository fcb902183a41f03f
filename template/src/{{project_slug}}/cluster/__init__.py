"""Nodes and processes: the topology of the platform that started this node (the one place its
variables are read), the node launcher, torchrun and its rendezvous, supervision, Ray.
"""
