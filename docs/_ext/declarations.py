"""Docs written from the declarations of the settings and view options (``_conf.Settings``).

``.. idempotency-settings::`` is the table of every setting, ``.. idempotency-setting:: NAME``
one setting's entry (its default, view option and checks, then the directive's own text), and
``.. idempotency-options::`` the table of the view options. A declared setting that no
``idempotency-setting`` documents, or one documented but not declared, is a warning, so
``sphinx -W`` fails until the docs follow the code.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from django_idempotency._conf.settings import OPTIONS, SETTINGS, Option, Setting

logger = logging.getLogger(__name__)
_BY_NAME = {setting.name: setting for setting in SETTINGS}


def default(setting: Setting[Any]) -> str:
    if setting.shown is not None:
        return setting.shown
    if isinstance(setting.default, timedelta):
        return _duration(setting.default)
    return f"``{_literal(setting.default)}``"


def _literal(value: object) -> str:
    """As a settings file writes it: double quotes, as the rest of the docs do."""
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return f"({', '.join(map(_literal, value))})"
    return repr(value)


def _duration(value: timedelta) -> str:
    seconds = value.total_seconds()
    for unit, size in (("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds:g} seconds"


def checks(setting: Setting[Any]) -> str:
    return ", ".join(f"E{check.id:03d}" for check in setting.checks)


def option_text(option: Option) -> str:
    text = f"View option ``{option.name}``, mixin attribute ``{option.attribute}``"
    if option.function:
        text += f", ``idempotent_function({option.name}=...)``"
    return text


def _table(header: list[str], rows: list[list[str]], widths: str) -> list[str]:
    lines = [".. list-table::", "   :header-rows: 1", f"   :widths: {widths}", ""]
    for row in [header, *rows]:
        lines.append(f"   * - {row[0]}")
        lines.extend(f"     - {cell}" for cell in row[1:])
    return lines


class _Generated(SphinxDirective):
    def parse(self, lines: list[str]) -> list[nodes.Node]:
        container = nodes.container()
        self.state.nested_parse(StringList(lines, self.get_source_info()[0]), 0, container)
        return container.children


class SettingsTable(_Generated):
    def run(self) -> list[nodes.Node]:
        rows = [
            [
                f"``{setting.name}``",
                default(setting),
                f"``{setting.option.name}``" if setting.option else "",
                checks(setting),
                setting.doc,
            ]
            for setting in SETTINGS
        ]
        header = ["setting", "default", "view option", "checks", "what it does"]
        return self.parse(_table(header, rows, "22 18 14 10 36"))


class SettingEntry(_Generated):
    required_arguments = 1
    has_content = True

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        setting = _BY_NAME.get(name)
        if setting is None:
            logger.warning(f"{name} is not a declared setting", location=self.get_location())
            return []
        documented = self.env.idempotency_settings  # type: ignore[attr-defined]
        documented.setdefault(self.env.docname, set()).add(name)
        facts = [f"Default {default(setting)}."]
        if setting.option is not None:
            facts.append(f"{option_text(setting.option)}.")
        if setting.checks:
            facts.append(f"Checks: {checks(setting)}.")
        lines = [f"``{name}``", f"    {' '.join(facts)}", ""]
        lines.extend(f"    {line}" if line else "" for line in self.content)
        return self.parse(lines)


class OptionsTable(_Generated):
    def run(self) -> list[nodes.Node]:
        rows = [
            [
                f"``{option.name}``",
                f"``{option.setting}``" if option.setting else "",
                f"``{option.attribute}``",
                "yes" if option.function else "",
                option.doc or _BY_NAME[option.setting or ""].doc,
            ]
            for option in OPTIONS
        ]
        header = ["option", "overrides", "mixin attribute", "functions", "what it does"]
        return self.parse(_table(header, rows, "16 22 26 10 26"))


def _init(app: Sphinx, env: BuildEnvironment, docnames: list[str]) -> None:
    if not hasattr(env, "idempotency_settings"):
        env.idempotency_settings = {}  # type: ignore[attr-defined]


def _purge(app: Sphinx, env: BuildEnvironment, docname: str) -> None:
    getattr(env, "idempotency_settings", {}).pop(docname, None)


def _merge(app: Sphinx, env: BuildEnvironment, docnames: set[str], other: BuildEnvironment) -> None:
    env.idempotency_settings.update(other.idempotency_settings)  # type: ignore[attr-defined]


def _check(app: Sphinx, env: BuildEnvironment) -> None:
    documented = set().union(*getattr(env, "idempotency_settings", {}).values())
    for name in _BY_NAME.keys() - documented:
        logger.warning(f"setting {name} is declared but has no '.. idempotency-setting:: {name}'")


def setup(app: Sphinx) -> dict[str, Any]:
    directives.register_directive("idempotency-settings", SettingsTable)
    directives.register_directive("idempotency-setting", SettingEntry)
    directives.register_directive("idempotency-options", OptionsTable)
    app.connect("env-before-read-docs", _init)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("env-check-consistency", _check)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
