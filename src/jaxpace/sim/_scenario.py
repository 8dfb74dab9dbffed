"""Simulator scenarios: frozen dataclasses loaded from JSON presets or user files."""

from __future__ import annotations

import dataclasses
import json
import warnings
from importlib import resources
from pathlib import Path
from typing import Any

from jaxpace._validate import check_number
from jaxpace.errors import ScenarioError

__all__ = [
    "CollectiveModel",
    "ComputeModel",
    "CouplingModel",
    "FabricModel",
    "LocalityModel",
    "PacingSettings",
    "Scenario",
    "StragglerModel",
    "ThermalModel",
    "load_scenario",
    "preset_names",
]


def _rng(lo: float, hi: float, *, integer: bool = False, lo_open: bool = False) -> dict:
    return {"lo": lo, "hi": hi, "integer": integer, "lo_open": lo_open}


def _validate(obj: Any, prefix: str) -> None:
    """Checks every field of a config dataclass against its `metadata` range or choices."""
    for f in dataclasses.fields(obj):
        spec = f.metadata
        value = getattr(obj, f.name)
        where = f"{prefix}.{f.name}" if prefix else f.name
        if "choices" in spec:
            if value not in spec["choices"]:
                choices = ", ".join(f"`{c}`" for c in spec["choices"])
                raise ScenarioError(f"`{where}` must be one of {choices}, got {value!r}.")
            continue
        if "lo" not in spec:
            continue
        check_number(
            where,
            value,
            lo=spec["lo"],
            hi=spec["hi"],
            lo_open=spec["lo_open"],
            integer=spec["integer"],
            error=ScenarioError,
        )
        object.__setattr__(obj, f.name, int(value) if spec["integer"] else float(value))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ComputeModel:
    """Per-rank compute time of one step (the work before the collective).

    Attributes:
      base_s: nominal compute seconds per step of a median rank.
      static_sigma: log-σ of the per-rank static speed factor (same-SKU spread).
      outlier_prob: chance a rank is a static outlier.
      outlier_factor: slowdown of an outlier rank (e.g. 1.5).
      jitter_sigma: log-σ of the per-step, per-rank lognormal jitter.
      backward_fraction: share of the step's compute that is the backward pass,
        split evenly over `collective.buckets` gradient buckets (the rest is the
        forward pass, before any bucket). `[0, 1]`; ~2/3 for transformers.
      bucket_jitter_sigma: log-σ of an extra lognormal jitter on each rank's
        backward compute of each bucket, independent across buckets (kernel-level
        noise at millisecond scale). `[0, 1]`.
    """

    base_s: float = dataclasses.field(default=0.1, metadata=_rng(0.0, 3600.0, lo_open=True))
    static_sigma: float = dataclasses.field(default=0.02, metadata=_rng(0.0, 1.0))
    outlier_prob: float = dataclasses.field(default=0.0, metadata=_rng(0.0, 1.0))
    outlier_factor: float = dataclasses.field(default=1.5, metadata=_rng(1.0, 10.0))
    jitter_sigma: float = dataclasses.field(default=0.02, metadata=_rng(0.0, 1.0))
    backward_fraction: float = dataclasses.field(default=2.0 / 3.0, metadata=_rng(0.0, 1.0))
    bucket_jitter_sigma: float = dataclasses.field(default=0.0, metadata=_rng(0.0, 1.0))

    def __post_init__(self) -> None:
        _validate(self, "compute")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StragglerModel:
    """Markov-modulated episodic stragglers (fail-slow GPUs, noisy neighbours).

    A rank not in an episode starts one with probability `onset_prob` per step.
    The episode lasts `dwell` steps, Pareto-distributed (`dwell_min_steps`, shape
    `dwell_alpha`, capped at `dwell_max_steps`), and multiplies the rank's compute
    by a magnitude `min(magnitude_max, magnitude_min · Pareto(magnitude_alpha))`.
    """

    onset_prob: float = dataclasses.field(default=0.0, metadata=_rng(0.0, 1.0))
    dwell_min_steps: int = dataclasses.field(default=1, metadata=_rng(1, 10**6, integer=True))
    dwell_alpha: float = dataclasses.field(default=1.5, metadata=_rng(0.1, 100.0))
    dwell_max_steps: int = dataclasses.field(default=1000, metadata=_rng(1, 10**7, integer=True))
    magnitude_min: float = dataclasses.field(default=2.0, metadata=_rng(1.0, 100.0))
    magnitude_alpha: float = dataclasses.field(default=100.0, metadata=_rng(0.1, 1000.0))
    magnitude_max: float = dataclasses.field(default=3.0, metadata=_rng(1.0, 100.0))

    def __post_init__(self) -> None:
        _validate(self, "stragglers")
        if self.magnitude_max < self.magnitude_min:
            raise ScenarioError(
                f"`stragglers.magnitude_max` ({self.magnitude_max}) must be >= "
                f"`stragglers.magnitude_min` ({self.magnitude_min})."
            )
        if self.dwell_max_steps < self.dwell_min_steps:
            raise ScenarioError(
                f"`stragglers.dwell_max_steps` ({self.dwell_max_steps}) must be >= "
                f"`stragglers.dwell_min_steps` ({self.dwell_min_steps})."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ThermalModel:
    """Per-node AR(1) drift of the log compute time: stationary log-σ `sigma`, lag-1 `rho`."""

    sigma: float = dataclasses.field(default=0.0, metadata=_rng(0.0, 1.0))
    rho: float = dataclasses.field(default=0.99, metadata=_rng(0.0, 1.0))

    def __post_init__(self) -> None:
        _validate(self, "thermal")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalityModel:
    """PCIe/NUMA path from GPU to NIC.

    Attributes:
      far_fraction: share of each node's GPUs on the far NUMA node from their NIC.
      far_bw_factor: their inter-node bandwidth relative to a near GPU, `(0, 1]`;
        a rail ring runs at its slowest member's bandwidth.
      far_compute_penalty: relative extra pre-collective time of a far GPU
        (host-staged input copies crossing the socket link), e.g. 0.02.
    """

    far_fraction: float = dataclasses.field(default=0.0, metadata=_rng(0.0, 1.0))
    far_bw_factor: float = dataclasses.field(default=1.0, metadata=_rng(0.0, 1.0, lo_open=True))
    far_compute_penalty: float = dataclasses.field(default=0.0, metadata=_rng(0.0, 1.0))

    def __post_init__(self) -> None:
        _validate(self, "locality")


ALGORITHMS = ("ring", "tree", "hierarchical")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CollectiveModel:
    """The gradient all-reduce of each step (alpha-beta costs), optionally bucketed.

    Attributes:
      algorithm: `ring`, `tree` or `hierarchical` (see `jaxpace.sim` cost functions).
      n_bytes: bytes per rank (all buckets together).
      buckets: number of gradient buckets `B` (data-parallel backward, as in
        PyTorch DDP / bucketed `psum`s): bucket `j`'s all-reduce of `n_bytes / B`
        is launched when a rank finishes that bucket's backward compute and
        overlaps the backward compute of later buckets. 1 = one all-reduce after
        all compute (the plain BSP step). `[1, 256]`.
      alpha_intra_s / bw_intra_gbyte_s: NVLink per-hop latency (s) and bandwidth
        (GB/s, 1e9 bytes per second).
      alpha_inter_s / bw_inter_gbyte_s: network per-hop latency (s) and per-NIC
        bandwidth (GB/s; a 400 Gb/s NIC carries at most 50).

    Scenario files written before the rename may still say `bw_intra_gbps` /
    `bw_inter_gbps` (which meant GB/s, not gigabits): `Scenario.from_dict`
    reads them as the new fields with a `DeprecationWarning`.
    """

    algorithm: str = dataclasses.field(default="hierarchical", metadata={"choices": ALGORITHMS})
    n_bytes: float = dataclasses.field(default=5e8, metadata=_rng(0.0, 1e13))
    buckets: int = dataclasses.field(default=1, metadata=_rng(1, 256, integer=True))
    alpha_intra_s: float = dataclasses.field(default=2e-6, metadata=_rng(0.0, 1.0))
    bw_intra_gbyte_s: float = dataclasses.field(
        default=370.0, metadata=_rng(0.0, 1e5, lo_open=True)
    )
    alpha_inter_s: float = dataclasses.field(default=6e-6, metadata=_rng(0.0, 1.0))
    bw_inter_gbyte_s: float = dataclasses.field(default=46.0, metadata=_rng(0.0, 1e5, lo_open=True))

    def __post_init__(self) -> None:
        _validate(self, "collective")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FabricModel:
    """Rail-optimized two-tier Clos.

    Each rail has a leaf switch per scalable unit of `nodes_per_leaf` nodes; a
    leaf has `nodes_per_leaf / oversubscription` uplinks to the spine. Once a job
    spans several leaves, `ecmp_flows` elephant flows per leaf hash onto those
    uplinks and the inter-node term is stretched by the busiest uplink's flow
    count (a link shared by m flows gives each 1/m of its bandwidth); higher
    oversubscription means fewer uplinks and more collisions.
    """

    nodes_per_leaf: int = dataclasses.field(default=32, metadata=_rng(1, 10**6, integer=True))
    oversubscription: float = dataclasses.field(default=1.0, metadata=_rng(1.0, 64.0))
    ecmp_flows: int = dataclasses.field(default=8, metadata=_rng(0, 10**4, integer=True))

    def __post_init__(self) -> None:
        _validate(self, "fabric")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CouplingModel:
    """Couplings between ranks beyond the bulk-synchronous rule; 0 switches one off.

    Attributes:
      shared_links: (a) mean utilization, `[0, 0.9]`, of the inter-node links by
        other tenants' traffic; each step samples `u ~ Beta` with that mean and
        stretches the inter-node term by `1/(1-u)`.
      spin_compute: (b) slowdown `s` `[0, 1]` of a rank's backward compute while
        one of its gradient-bucket all-reduce kernels is launched and spinning
        for a peer that has not launched yet: compute runs `1 + s` times slower
        (SMs and memory bandwidth taken by the spinning NCCL kernel). Needs
        `collective.buckets >= 2`: only then is compute overlapped with a
        collective. Plausible 0.05-0.5.
      power_budget: (c) relative speed-up `[0, 1]` of a computing GPU while all
        its node-mates sleep instead of spinning (shared node power budget).
      host_runahead: (d) relative slowdown `[0, 10]` of a rank's host-bound work
        while all its node-mates' hosts spin-wait (run-ahead dispatch, proxy
        threads) instead of sleeping.
      host_fraction: share of each step that is host-bound, `[0, 1]`.
    """

    shared_links: float = dataclasses.field(default=0.0, metadata=_rng(0.0, 0.9))
    spin_compute: float = dataclasses.field(default=0.0, metadata=_rng(0.0, 1.0))
    power_budget: float = dataclasses.field(default=0.0, metadata=_rng(0.0, 1.0))
    host_runahead: float = dataclasses.field(default=0.0, metadata=_rng(0.0, 10.0))
    host_fraction: float = dataclasses.field(default=0.1, metadata=_rng(0.0, 1.0))

    def __post_init__(self) -> None:
        _validate(self, "coupling")


PACING_SITES = ("first_bucket", "every_bucket")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PacingSettings:
    """How the simulated runtime paces: decision lag plus `adaptive` settings.

    Attributes:
      lag_steps: a decision made from step k's observation is slept before step
        `k + lag_steps`'s collective (2 in the real runtime: waits ride in-band
        with the next collective).
      sites: where the runtime paces when the step has several gradient buckets:
        `first_bucket` (one pacing site, the first bucket's all-reduce: it
        observes that bucket's earliness and delays that bucket's launch;
        later launches keep host order) or `every_bucket` (each bucket's
        all-reduce is its own site with its own policy state, as when every
        bucket's `psum` goes through the pacer).
      adaptive: keyword arguments of `jaxpace.adaptive` used when the policy is
        `adaptive` (validated by `AdaptiveConfig`).
    """

    lag_steps: int = dataclasses.field(default=2, metadata=_rng(1, 1000, integer=True))
    sites: str = dataclasses.field(default="first_bucket", metadata={"choices": PACING_SITES})
    adaptive: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        _validate(self, "pacing")
        from jaxpace.policy.adaptive import AdaptiveConfig

        valid = {f.name for f in dataclasses.fields(AdaptiveConfig)}
        for key in self.adaptive:
            if key not in valid:
                raise ScenarioError(
                    f"Unknown field `pacing.adaptive.{key}`. Valid fields: "
                    + ", ".join(f"`{v}`" for v in sorted(valid))
                    + "."
                )
        try:
            AdaptiveConfig(**self.adaptive)
        except ValueError as e:
            raise ScenarioError(f"`pacing.adaptive`: {e}") from None


# Old field names still read from scenario files: section -> {old: new}.
_RENAMED = {
    "collective": {"bw_intra_gbps": "bw_intra_gbyte_s", "bw_inter_gbps": "bw_inter_gbyte_s"},
}


def _renamed(key: str, value: dict, source: str) -> dict:
    """`value` with old field names of section `key` replaced by their new names (one warning)."""
    out = dict(value)
    moved = []
    for old, new in _RENAMED.get(key, {}).items():
        if old not in out:
            continue
        if new in out:
            raise ScenarioError(
                f"{source}: `{key}.{old}` is the old name of `{key}.{new}`; give only `{new}`."
            )
        out[new] = out.pop(old)
        moved.append(f"`{key}.{old}` to `{key}.{new}`")
    if moved:
        warnings.warn(
            f"{source}: old field names (they meant GB/s); rename {', '.join(moved)}.",
            DeprecationWarning,
            stacklevel=4,
        )
    return out


_SECTIONS: dict[str, type] = {
    "compute": ComputeModel,
    "stragglers": StragglerModel,
    "thermal": ThermalModel,
    "locality": LocalityModel,
    "collective": CollectiveModel,
    "fabric": FabricModel,
    "coupling": CouplingModel,
    "pacing": PacingSettings,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scenario:
    """A simulated cluster: hardware, noise, couplings and pacing settings.

    Build one with `load_scenario` (a preset name or a JSON file), or directly
    and change it with `dataclasses.replace`.

    >>> s = load_scenario("pure-bsp")
    >>> s.name, s.gpus_per_node, s.coupling.spin_compute
    ('pure-bsp', 8, 0.0)
    """

    name: str = "custom"
    description: str = ""
    gpus_per_node: int = dataclasses.field(default=8, metadata=_rng(1, 1024, integer=True))
    compute: ComputeModel = dataclasses.field(default_factory=ComputeModel)
    stragglers: StragglerModel = dataclasses.field(default_factory=StragglerModel)
    thermal: ThermalModel = dataclasses.field(default_factory=ThermalModel)
    locality: LocalityModel = dataclasses.field(default_factory=LocalityModel)
    collective: CollectiveModel = dataclasses.field(default_factory=CollectiveModel)
    fabric: FabricModel = dataclasses.field(default_factory=FabricModel)
    coupling: CouplingModel = dataclasses.field(default_factory=CouplingModel)
    pacing: PacingSettings = dataclasses.field(default_factory=PacingSettings)

    def __post_init__(self) -> None:
        _validate(self, "")
        for key, cls in _SECTIONS.items():
            if not isinstance(getattr(self, key), cls):
                raise ScenarioError(
                    f"`{key}` must be a {cls.__name__}, got {type(getattr(self, key)).__name__}."
                )

    @classmethod
    def from_dict(cls, data: dict, *, source: str = "<dict>") -> Scenario:
        """Builds a scenario from plain data (the JSON layout); missing fields keep defaults.

        Raises:
          ScenarioError: an unknown or invalid field (the message names it and
            lists the valid ones).
        """
        if not isinstance(data, dict):
            raise ScenarioError(
                f"{source}: a scenario must be a JSON object, got {type(data).__name__}."
            )
        top = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in top:
                raise ScenarioError(
                    f"{source}: unknown field `{key}`. Valid fields: "
                    + ", ".join(f"`{t}`" for t in sorted(top))
                    + "."
                )
            if key in _SECTIONS:
                section = _SECTIONS[key]
                if not isinstance(value, dict):
                    raise ScenarioError(f"{source}: `{key}` must be an object, got {value!r}.")
                value = _renamed(key, value, source)
                valid = {f.name for f in dataclasses.fields(section)}
                for sub in value:
                    if sub not in valid:
                        raise ScenarioError(
                            f"{source}: unknown field `{key}.{sub}`. Valid fields: "
                            + ", ".join(f"`{v}`" for v in sorted(valid))
                            + "."
                        )
                try:
                    kwargs[key] = section(**value)
                except ScenarioError as e:
                    raise ScenarioError(f"{source}: {e}") from None
            else:
                kwargs[key] = value
        try:
            return cls(**kwargs)
        except ScenarioError as e:
            raise ScenarioError(f"{source}: {e}") from None

    def to_dict(self) -> dict:
        """The JSON layout of this scenario (round-trips through `from_dict`)."""
        return dataclasses.asdict(self)


def preset_names() -> list[str]:
    """Names of the scenarios shipped with jaxpace, sorted.

    >>> "paper" in preset_names() and "pure-bsp" in preset_names()
    True
    """
    root = resources.files("jaxpace.sim") / "scenarios"
    return sorted(p.name[: -len(".json")] for p in root.iterdir() if p.name.endswith(".json"))


def load_scenario(name_or_path: str | Path | Scenario) -> Scenario:
    """Loads a preset by name (`paper`, `pure-bsp`, ...) or a user JSON file by path.

    Args:
      name_or_path: a preset name, a path to a `.json` file, or a `Scenario`
        (returned unchanged).

    Raises:
      ScenarioError: unknown preset (the message lists them), unreadable file,
        or an invalid field.

    >>> load_scenario("paper").gpus_per_node
    8
    >>> load_scenario("nope")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    jaxpace.errors.ScenarioError: Unknown scenario `nope`: not a preset and not a file. Presets: ...
    """
    if isinstance(name_or_path, Scenario):
        return name_or_path
    text = str(name_or_path)
    path = Path(text)
    if text in preset_names():
        source = f"preset `{text}`"
        raw = (resources.files("jaxpace.sim") / "scenarios" / f"{text}.json").read_text()
    elif path.suffix == ".json" or path.exists():
        source = str(path)
        try:
            raw = path.read_text()
        except OSError as e:
            raise ScenarioError(
                f"Cannot read scenario file `{path}`: {e}. Pass an existing JSON file."
            ) from None
    else:
        presets = ", ".join(f"`{p}`" for p in preset_names())
        raise ScenarioError(
            f"Unknown scenario `{text}`: not a preset and not a file. Presets: {presets}; "
            "or pass a path to a JSON scenario file."
        )
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ScenarioError(
            f"{source}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}."
        ) from None
    except RecursionError:
        raise ScenarioError(f"{source}: JSON nested too deeply to read.") from None
    if not isinstance(data, dict):
        raise ScenarioError(
            f"{source}: the top level must be a JSON object of scenario fields "
            f'(e.g. {{"gpus_per_node": 8, "compute": {{...}}}}), got a {type(data).__name__}. '
            "See docs/simulation.md for the fields."
        )
    data.setdefault("name", text if source.startswith("preset") else path.stem)
    return Scenario.from_dict(data, source=source)
