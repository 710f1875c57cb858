"""The client floor: what training code imports (issue 21 layout).

Light on purpose: schemas, kafka-python, pydantic, cryptography. Framework hooks sit
in sub-packages, each behind its own extra: :mod:`pipeline.client.pytorch`
(``pip install 'stepguard[torch]'``).
"""
