"""Bulk jobs: cancel or replay every task that matches a filter, in bounded steps, carried on
by any process (docs/design.md, "Bulk jobs").

    sources.py   which indexes a job walks, and the filter it gives the scripts
    runner.py    JobRunner: the small task each ``timewheel serve`` runs to take and work jobs
"""
