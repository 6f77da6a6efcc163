"""The frozen artifact: the policy parameters the runtime consumes (schema, export, load, validation)."""

from .params import AcceptanceModel, PolicyParameters

__all__ = ["AcceptanceModel", "PolicyParameters"]
