"""Leaf layer: errors, values, sizes and the names of every run choice; every other layer may
import it, it imports nothing of this package outside itself."""
