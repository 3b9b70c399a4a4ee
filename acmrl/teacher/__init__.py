"""Teacher: assessments of student trajectories, the oracle teacher, splice-and-resume.

- :mod:`acmrl.teacher.assessment`: the ``Assessment`` type and its validators;
- :mod:`acmrl.teacher.oracle`: edits placed from the environment's ground truth;
- :mod:`acmrl.teacher.splice`: the student resumes from the teacher's edit.
"""
