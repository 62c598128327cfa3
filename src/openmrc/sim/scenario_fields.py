"""What every table of the scenario schema is made of: `Section`, a pydantic model that forbids unknown keys
and converts nothing, and `setting`, one key with its default, unit, meaning and rule.

The schema's tables are `openmrc.sim.scenario_schema`'s; the workload and failure kinds keep their keys
beside what builds them (`openmrc.sim.scenario_workloads`, `openmrc.sim.scenario_failures`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Section", "setting"]


def setting(default: Any, unit: str, description: str, **rules: Any) -> Any:
    """A key of a table: ``default`` (``...``: required), its ``unit`` and meaning (both in the generated
    reference, docs/scenarios.md) and pydantic's rules (``ge``, ``gt``, ``le``, ``lt``, ``min_length``)."""
    return Field(default, description=description, json_schema_extra={"unit": unit}, **rules)


class Section(BaseModel):
    """A table of a scenario file: unknown keys are errors, values are taken as given (strict)."""

    model_config = ConfigDict(extra="forbid", strict=True)
