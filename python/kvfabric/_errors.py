"""kvfabric's exceptions. The native module defines the single-base ones; the
two that are also builtins' (ValueError, TimeoutError) are defined here."""

from kvfabric._native import AuthError, ConnectError, KvfabricError, NodeError


class InvalidArgument(KvfabricError, ValueError):
    """A key, layout or buffer the call cannot use (wrong length, wrong size...)."""


class Timeout(KvfabricError, TimeoutError):
    """The call ran past its deadline."""


__all__ = ["KvfabricError", "ConnectError", "AuthError", "NodeError", "InvalidArgument", "Timeout"]
