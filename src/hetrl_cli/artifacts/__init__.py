"""Artifacts: the JSON files that join the stages (hosts, profile, workload, plan, run summary)."""
