"""The exercises, one module each (see ``lab.grade.exercise``)."""
