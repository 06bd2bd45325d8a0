"""Student mode: check a student's own needle, offline, question by question.

``python -m companion.check path/to/hw2`` (or ``make check HW=path/to/hw2``) imports the needle in
that folder (the course's skeleton layout), builds its C++/CUDA sources, and runs this project's
checks for the homework, one line per question with a diagnosis for each failure. The question
registry in ``questions.py`` is shared with the test suite's pytest markers.
"""

from .questions import HOMEWORKS, QUESTIONS, Question, questions_for
from .runner import Report, Result, check

__all__ = ["HOMEWORKS", "QUESTIONS", "Question", "questions_for", "Report", "Result", "check"]
