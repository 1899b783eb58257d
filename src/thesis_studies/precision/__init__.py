"""Chapter 2's precision section: float32, bfloat16, int8 and int4 side by side on the CPU (:mod:`.bench`,
``thesis-lib studies precision-bench``), their tables (:mod:`.tables`), the byte floor (:mod:`.floor`), where a
step's time goes (:mod:`.stepprofile`, ``thesis-lib studies step-profile``) and the verdicts (:mod:`.verdicts`)."""

from dataclasses import dataclass, field

from thesis_lib import extensions

from . import cli, verdicts


@extensions.parameters
@dataclass
class Parameters:
    """Saved documents shown in chapter 2: ``thesis-lib studies precision-bench``'s (float32 against bfloat16 on
    this CPU kind; the same from a CPU without native bf16, ``--emulated``, where DTYPE auto's pick is checked;
    float32's two packed layouts; the weight-only formats beside float32, the byte floor's table) and ``thesis-lib
    studies step-profile``'s (where a decode step's time goes, in the appendix)."""

    precision_file: str | None = None
    precision_file_no_bf16: str | None = None
    precision_file_layouts: str | None = None
    precision_files_weight_only: list = field(default_factory=list)
    step_profile_file: str | None = None


extensions.add_rules(verdicts.RULES)
extensions.COMMANDS.append(cli.add_parsers)
