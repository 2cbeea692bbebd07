"""Moved: the worker program is monitor/worker_program.py, fhmon serve's end of it
monitor/worker_supervisor.py (this name goes once fhmon serve imports from there)."""

from monitor.worker_supervisor import WorkerProcess, WorkerStartError

__all__ = ["WorkerProcess", "WorkerStartError"]
