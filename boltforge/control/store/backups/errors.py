"""What a backup or restore raises when it cannot be done, and the fix its messages share."""

from __future__ import annotations

RETAKE = "To fix: take the backup again, or restore another copy of it"


class BackupError(Exception):
    """A backup or restore that cannot be done; the message names the problem and its fix."""


class StoreNotEmpty(BackupError):
    """The restore's target already holds rows, and replacing them was not asked for."""
