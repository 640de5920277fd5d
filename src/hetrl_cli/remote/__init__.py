"""Reaching hosts over SSH (shared by profiling and the runtime launcher)."""
