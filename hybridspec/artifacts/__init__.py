"""The frozen artifact: the policy parameters the runtime consumes (schema, export, load, validation)."""

from .artifact import ArtifactError, check_identity, load_artifact, save_artifact
from .params import AcceptanceModel, PolicyParameters

__all__ = ["AcceptanceModel", "ArtifactError", "PolicyParameters", "check_identity", "load_artifact", "save_artifact"]
