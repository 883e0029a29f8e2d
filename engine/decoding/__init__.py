"""Decoding: the model runtime, the step loop, verification, proposers, the cost model."""
