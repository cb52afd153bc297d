"""Backends, one module per device kind, each defining one DevicePlugin subclass.

Nothing here is imported by ``import anychip``; the registry imports a backend
the first time it is needed.
"""
