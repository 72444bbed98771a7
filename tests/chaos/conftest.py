"""Fixtures of the chaos suite: the integration fixtures, imported (as tests/e2e does).

Run it in a pytest session of its own (`make chaos`): fixtures imported into two
conftests are two fixtures to pytest, so one session holding tests/integration too
would start two operators.
"""

from __future__ import annotations

from integration.conftest import cluster, namespace
from integration.trainwave_fixtures import operator, running_operator, trainwave_installed

__all__ = ["cluster", "namespace", "operator", "running_operator", "trainwave_installed"]
