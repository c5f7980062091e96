"""The amux Hub: memory store, identity, settings and the Hub RPC."""

__version__ = "0.1.0"
