"""`launch kubeflow`: platform.py (the manifest, the actions, the Platform), kubernetes_api.py (the
Kubernetes API calls) and restarts.py (the grace-period check, the restart view). launch/ finds the
platform by this package's PLATFORM."""

from .platform import PLATFORM, Kubeflow

__all__ = ["PLATFORM", "Kubeflow"]
