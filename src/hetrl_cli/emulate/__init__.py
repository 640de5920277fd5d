"""A heterogeneous cluster on one machine: hosts as network namespaces, slow links by tc, slow devices by cgroups.

`emulate_up(spec, state_dir)` builds it from a cluster spec (spec.py) and writes the hosts.txt to profile, plan
and run against; `emulate_down(state_dir)` removes everything it made, even after a crash. See docs/emulate.md.
Nothing heavy is imported here: `python -m` and the CLI stay fast.
"""
