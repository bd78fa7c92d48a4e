"""What every section of cluster.toml is (`ConfigModel`), and what the rest of the code may ask
of any backend's section (`BackendSection`): the built-in ones and a plug-in's alike."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict


class ConfigModel(BaseModel):
    # strict: no silent coercion ("2" or true is not an int; ints are still fine as floats);
    # inf and nan are refused in every float.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


@dataclass(frozen=True)
class HostPlace:
    """A host as cluster.toml names it: its label, the address its tasks listen on ("": the
    scheduler's choice, known once allocated) and whether it is a spare."""

    label: str
    address: str
    spare: bool = False


LOOPBACK = "127.0.0.1"


class BackendSection(ConfigModel):
    """`[backend]`: its `type` names the backend, which registers this section's model
    (`orchestrator.config.registry`). The rest of the code asks a section only these."""

    type: str

    def places(self) -> tuple[HostPlace, ...]:
        """Every host, in cluster.toml's order (a task's host is its position here)."""
        raise NotImplementedError

    def host_slots(self, host: int) -> int | None:
        """Tasks on this host (by position); None: "per_gpu", known once its GPUs are counted."""
        return 1

    def host_gpus_per_task(self, host: int) -> int:
        """GPUs each task on this host gets; 0: none assigned (CUDA_VISIBLE_DEVICES left
        alone)."""
        return 0
