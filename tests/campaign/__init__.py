"""The fault campaign (issue 30): a workload of producer and consumer processes on a
3-node cluster, a nemesis acting on them, and checkers over the recorded history.

``python -m tests.campaign --seed N --duration S [--short] [--out DIR]`` runs one campaign;
``runner.py`` orchestrates, ``workload.py`` holds what the worker processes share.
"""
