"""How big a tree pays: the device's verify cost curve (``cost``), the expected yield of a spine
tree under the acceptance estimates (``allocation``), and the per-cycle budget choice (``budget``).
"""
