"""Hang and presence: a job or node that stops reporting."""
