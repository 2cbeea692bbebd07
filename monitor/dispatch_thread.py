"""The old name of monitor/answer_loop.py's PythonAnswerLoop, kept only for monitor/worker.py
(owned by another branch, which splits it) until that split lands: delete it then."""

from monitor.answer_loop import PythonAnswerLoop as DispatchThread

__all__ = ["DispatchThread"]
