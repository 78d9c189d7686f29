"""MQAR: associative recall against state size (README.md beside this file)."""
