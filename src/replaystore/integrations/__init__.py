"""Bridges to the ecosystem: PyTorch tensors, Gymnasium spaces, Stable-Baselines3.

Each module imports its framework lazily, so ``import replaystore`` never needs them.
"""
