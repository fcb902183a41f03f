"""`launch kubeflow`: platform.py (the manifest, the actions, the Platform), kubernetes_api.py (the
Kubernetes API calls), restarts.py (the pods' grace period, restart policies and counts),
environment.py (what the training-operator tells a pod)."""
