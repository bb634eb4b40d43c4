"""Subcommands whose modules load only when they run (or when help lists them), so a quick
call such as ``bolt queue`` does not pay for the server's or the simulator's imports."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import ClassVar

import typer
from typer import _click as click  # the click that typer's groups are built on
from typer.core import TyperGroup
from typer.main import get_command, get_group

from boltforge.cli.helptext import reflow_tree


@dataclass(frozen=True, slots=True)
class Lazy:
    """Where a subcommand lives: ``module.attr`` is a command function or a ``typer.Typer``
    (a group of subcommands), shown under ``panel`` in ``bolt --help``."""

    module: str
    attr: str
    panel: str | None = None

    def load(self, name: str) -> click.Command:
        """The subcommand, imported, with its help texts reflowed for rich to wrap."""
        target = getattr(import_module(self.module), self.attr)
        if isinstance(target, typer.Typer):
            group = get_group(target)
            group.name = name
            group.rich_help_panel = self.panel
            return reflow_tree(group)
        single = typer.Typer()
        single.command(name, rich_help_panel=self.panel)(target)
        return reflow_tree(get_command(single))


class LazyGroup(TyperGroup):
    """A command group that imports a subcommand's module the first time it is asked for.
    Subclasses list their subcommands, in help order, in ``lazy``."""

    lazy: ClassVar[dict[str, Lazy]] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        eager = super().list_commands(ctx)
        return [*eager, *(name for name in self.lazy if name not in eager)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            self.commands[cmd_name] = self.lazy[cmd_name].load(cmd_name)
        return super().get_command(ctx, cmd_name)
