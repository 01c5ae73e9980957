from torchrl.data.replay_buffers.samplers import SliceSampler as _S
class SliceSampler(_S):
    """placeholder."""
