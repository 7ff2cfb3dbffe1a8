"""Leaf layer: names and values every other layer may import; it imports nothing of this package."""
