"""Checkpoint retention and lifecycle management service."""
