"""Errors shared across layers: :class:`UserError`, an error caused by the user's input that the command
line prints as one line (exit status 2)."""
from __future__ import annotations

import click

__all__ = ["UserError"]


class UserError(click.ClickException):
    """An error caused by the user's input: printed as one line, exit status 2."""

    exit_code = 2
