"""Glue that remembers: :class:`Glue` keeps every value a chapter notebook glued, so that its verdict sentences
(:mod:`thesis_lib.analysis.verdicts`) are computed from exactly the numbers its page prints, never typed beside them."""

from __future__ import annotations

from ..analysis import verdicts as rules


class Glue:
    """``glue(name, value, display=False)`` as myst-nb's, ``glue.all(values)`` for many, plus ``values``: every value
    glued so far."""

    def __init__(self, glue_fn):
        self._glue = glue_fn
        self.values: dict = {}
        self.disturbed: dict[str, str] = {}  # glued key -> why the machine was disturbed while it was measured

    def mark_disturbed(self, why_by_key: dict[str, str]) -> None:
        """These glued keys were measured on a disturbed machine (each with why): the verdicts built on any of
        them say so instead of judging."""
        self.disturbed.update(why_by_key)

    def __call__(self, name: str, value, display: bool = True):
        self.values[name] = value
        return self._glue(name, value, display=display)

    def all(self, values: dict) -> None:
        """Glue every value of ``values`` (name -> value), none displayed where it is glued."""
        for name, value in values.items():
            self(name, value, display=False)

    def verdicts(self, notebook: str) -> dict[str, str]:
        """Glue every verdict :func:`thesis_lib.analysis.verdicts.rules` lists for ``notebook`` (the thesis' and the
        studies'), each computed from the values this notebook glued under its input names; returns them."""
        out = {}
        for key, (rule, inputs) in rules.rules(notebook).items():
            names = inputs.values() if isinstance(inputs, dict) else inputs
            missing = [k for k in names if k not in self.values]
            if missing:
                raise KeyError(f"verdict {key!r} needs {missing}, which {notebook} did not glue")
            why = next((self.disturbed[k] for k in names if k in self.disturbed), None)
            if why is not None:
                out[key] = f"not judged, as the machine was busy with other work while this was measured ({why})"
            else:
                out[key] = (rule(**{p: self.values[k] for p, k in inputs.items()}) if isinstance(inputs, dict)
                            else rule(*(self.values[k] for k in inputs)))
            self(key, out[key], display=False)
        return out
