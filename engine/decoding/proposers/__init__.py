"""Proposers draft tokens for the target to verify: none, prompt lookup, or a draft model."""
