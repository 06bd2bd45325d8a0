"""companion: this project's tools beside the ``needle`` framework.

The student-mode checker (``python -m companion.check``), the NEEDLE_IMPL loader
(:mod:`companion.impl`), the lecture helpers (:mod:`companion.lecture`), figure saving
(:mod:`companion.viz`), timing (:mod:`companion.timing`), the offline data sets
(:mod:`companion.data`) and the course's applications (:mod:`companion.apps`). Each imports
``needle`` like any user code, so it runs on this project's needle or on a student's
(``NEEDLE_IMPL``). ``import needle`` imports none of them; importing this package imports
nothing either (it is loaded at every interpreter start-up when ``NEEDLE_IMPL`` is set).
"""
