"""Bodies of `POST /v1/planner`: how big a checkpoint is, how often to write one, and what
writing it synchronously stalls. Requests refuse unknown fields."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from app.api.cost_fields import (
    MAX_BYTES,
    DurationText,
    Money,
    Parameters,
    PerParameter,
    Positive,
    Recipe,
    Whole,
    whole,
)
from app.api.schemas import (
    Strict,
    not_both,
    only_with,
)
from app.cost.planner import (
    BYTES_PER_PARAMETER,
    DEFAULT_BYTES_PER_PARAMETER,
    Sizing,
    SizingInputs,
)
from app.domain.duration import parse_duration
from app.domain.errors import Invalid


class PlannerRequest(Strict):
    """Every input is optional; recipe and bytes_per_parameter exclude each other and need
    parameters, which excludes checkpoint_bytes."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "allOf": [
                not_both("recipe", "bytes_per_parameter"),
                not_both("parameters", "checkpoint_bytes"),
                only_with("recipe", "parameters"),
                only_with("bytes_per_parameter", "parameters"),
            ]
        },
    )

    parameters: Parameters | None = Field(None, examples=[70e9])
    bytes_per_parameter: PerParameter | None = Field(None, description="default 14")
    recipe: Recipe | None = Field(
        None,
        description="bytes per parameter by what is saved: "
        + ", ".join(f"{k} = {v}" for k, v in BYTES_PER_PARAMETER.items()),
    )
    checkpoint_bytes: Whole | None = Field(None, description="instead of parameters")
    interval: DurationText | None = Field(None, description="time between checkpoints")
    allowed_overlap: (
        Annotated[float, Field(ge=1e-9, le=1, allow_inf_nan=False, strict=True)] | None
    ) = Field(None, description="fraction of training time spent writing, e.g. 0.1")
    checkpoint_write_seconds: Positive | None = None
    mtbf: DurationText | None = Field(None, description="mean time between failures")
    checkpoints: Annotated[int, Field(ge=0, le=10**12), BeforeValidator(whole)] | None = None
    gpus: Annotated[int, Field(ge=1, le=10**9), BeforeValidator(whole)] | None = None
    usd_per_gpu_hour: Money | None = None

    def to_inputs(self) -> SizingInputs:
        """Raises Invalid for inputs that contradict each other. No inputs at all is a
        question with no outputs (each output is present when its inputs are given)."""
        if self.recipe is not None and self.bytes_per_parameter is not None:
            raise Invalid("give recipe or bytes_per_parameter, not both", field="recipe")
        if self.parameters is not None and self.checkpoint_bytes is not None:
            raise Invalid("give parameters or checkpoint_bytes, not both", field="checkpoint_bytes")
        per_parameter = self.bytes_per_parameter
        if self.recipe is not None:
            per_parameter = BYTES_PER_PARAMETER[self.recipe]
        if per_parameter is not None and self.parameters is None:
            field = "recipe" if self.recipe is not None else "bytes_per_parameter"
            raise Invalid("only with parameters", field=field)
        if self.parameters is not None:
            size = round(self.parameters * (per_parameter or DEFAULT_BYTES_PER_PARAMETER))
            if size > MAX_BYTES:
                raise Invalid(
                    f"a checkpoint of {size:.3g} bytes; at most {MAX_BYTES:.0e}", field="parameters"
                )
        return SizingInputs(
            parameters=self.parameters,
            bytes_per_parameter=per_parameter,
            checkpoint_bytes=self.checkpoint_bytes,
            interval=parse_duration(self.interval) if self.interval else None,
            allowed_overlap=self.allowed_overlap,
            checkpoint_write_seconds=self.checkpoint_write_seconds,
            mtbf=parse_duration(self.mtbf) if self.mtbf else None,
            checkpoints=self.checkpoints,
            gpus=self.gpus,
            usd_per_gpu_hour=self.usd_per_gpu_hour,
        )


class PlannerRead(BaseModel):
    """Each output is present when all its inputs were given."""

    bytes_per_parameter: float | None = None
    checkpoint_bytes: int | None = None
    write_bandwidth_bytes_per_s: float | None = None
    young_daly_interval_s: float | None = None
    sync_stall_gpu_hours: float | None = None
    sync_stall_usd: float | None = None
    incomplete: dict[str, list[str]] = Field(
        default_factory=dict, description="output -> inputs it still needs"
    )


def planner_read(sizing: Sizing) -> PlannerRead:
    return PlannerRead(
        bytes_per_parameter=sizing.bytes_per_parameter,
        checkpoint_bytes=sizing.checkpoint_bytes,
        write_bandwidth_bytes_per_s=sizing.write_bandwidth_bytes_per_s,
        young_daly_interval_s=sizing.young_daly_interval_s,
        sync_stall_gpu_hours=sizing.sync_stall_gpu_hours,
        sync_stall_usd=sizing.sync_stall_usd,
        incomplete=dict(sizing.incomplete),
    )
