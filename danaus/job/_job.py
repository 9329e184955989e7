"""Monarch's job model: a job spec that ``apply()`` brings into existence, and its state.

A job is a declarative spec (how many hosts, for which meshes) plus, once applied, the
scheduler's allocation. ``job.state()`` connects to the allocation and returns a
:class:`JobState` whose attributes are the requested host meshes. A job may be saved
(``job.dump(path)``, or ``job.state(cached_path=path)``) and loaded in a later
controller (``job_load(path)``), which then reuses the live allocation.
"""

from __future__ import annotations

import enum
import logging
import os
import pickle
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Self

from ..errors import a_type
from ._services import MeshAdminConfig, Services, TelemetryConfig

if TYPE_CHECKING:
    from ..mesh import HostMesh

__all__ = ["JobState", "JobStatus", "JobTrait", "job_load", "job_loads"]

log = logging.getLogger("danaus.job")

#: Monarch's default place for a job's cached state.
DEFAULT_JOB_PATH = ".monarch/job_state.pkl"


class JobState:
    """The host meshes of a running job, one attribute per requested mesh, and the
    addresses of the services it started (``enable_admin``, ``enable_telemetry``).

    Example::

        state = job.state()
        state.trainers      # HostMesh of the "trainers" mesh
        state.admin_url     # the admin endpoint (danaus top --attach ...), or None
    """

    def __init__(
        self,
        hosts: Mapping[str, HostMesh],
        telemetry_url: str | None = None,
        dashboard_url: str | None = None,
        admin_url: str | None = None,
    ) -> None:
        self._hosts = dict(hosts)
        #: where traces and metrics go (the OTLP endpoint), with telemetry enabled
        self.telemetry_url = telemetry_url
        #: the dashboard's page, with ``enable_telemetry(include_dashboard=True)``
        self.dashboard_url = dashboard_url
        #: the controller's admin endpoint, with ``enable_admin()``
        self.admin_url = admin_url

    def __getattr__(self, name: str) -> HostMesh:
        try:
            return self.__dict__["_hosts"][name]  # type: ignore[no-any-return]
        except KeyError:
            available = ", ".join(sorted(self.__dict__.get("_hosts", {})))
            raise AttributeError(
                f"{name!r} is not a host mesh of this job; its meshes: {available}"
            ) from None

    def __repr__(self) -> str:
        return f"JobState({self._hosts!r})"


class JobStatus(enum.Enum):
    """Where a job object stands: not applied, or applied (the allocation is its own), or
    loaded from a cache (the allocation was made by an earlier controller)."""

    NOT_RUNNING = "not running"
    RUNNING = "running"
    CACHED = "cached"


class JobTrait(ABC):
    """A job: a spec, and once applied, an allocation of hosts to make meshes on.

    ``apply()`` submits the job unless it runs already; ``state()`` connects to it and
    returns its host meshes; ``kill()`` ends it. Subclasses implement ``_create``,
    ``_state``, ``_kill`` and ``can_run``.
    """

    def __init__(self) -> None:
        self._status = JobStatus.NOT_RUNNING
        self._apply_id: str | None = None
        #: the saved job whose allocation this one uses (status CACHED)
        self._cached: JobTrait | None = None
        #: what enable_admin / enable_telemetry asked for
        self._services = Services()

    def enable_admin(self, config: MeshAdminConfig | None = None, **kwargs: str | None) -> Self:
        """Start the controller's admin endpoint with the next :meth:`state` (its address
        in ``state.admin_url``; ``danaus top`` and ``danaus debug`` attach to it).
        Takes a :class:`MeshAdminConfig`, or its fields as keywords. Returns the job."""
        self._services_of().admin = config if config is not None else MeshAdminConfig(**kwargs)
        return self

    def enable_telemetry(
        self,
        config: TelemetryConfig | None = None,
        *,
        mesh_admin_config: MeshAdminConfig | None = None,
        **kwargs: int | float | bool,
    ) -> Self:
        """Turn on OpenTelemetry traces and metrics with the next :meth:`state`, here and
        in the procs spawned from then on (``state.telemetry_url``: where they go), and
        the admin endpoint too (``mesh_admin_config``, else the default unless
        :meth:`enable_admin` chose one); with ``include_dashboard=True`` also the
        dashboard (``state.dashboard_url``). Takes a :class:`TelemetryConfig`, or its
        fields as keywords. Returns the job."""
        services = self._services_of()
        services.telemetry = config if config is not None else TelemetryConfig(**kwargs)  # type: ignore[arg-type]
        if mesh_admin_config is not None or services.admin is None:
            services.admin = mesh_admin_config or MeshAdminConfig()
        return self

    def _services_of(self) -> Services:
        services: Services | None = self.__dict__.get("_services")
        if services is None:  # a job saved before jobs had services
            services = self._services = Services()
        return services

    @property
    def status(self) -> JobStatus:
        return self._status

    @property
    def active(self) -> bool:
        """Whether this job object holds an allocation (its own or a cached one)."""
        return self._status is not JobStatus.NOT_RUNNING

    @property
    def apply_id(self) -> str | None:
        """A fresh id per allocation made by :meth:`apply`; kept by a saved job."""
        return self._cached._apply_id if self._cached is not None else self._apply_id  # noqa: SLF001 - a JobTrait's own

    @property
    def _running(self) -> JobTrait | None:
        """The job object that holds the allocation: this one, a cached one, or none."""
        if self._status is JobStatus.NOT_RUNNING:
            return None
        return self._cached if self._cached is not None else self

    def apply(self, client_script: str | None = None) -> None:
        """Bring the job into existence (submit it) unless it is running already.

        Args:
            client_script: Monarch runs this script as the client inside the
                allocation; danaus does not support that (the controller runs where you
                start it): it must be None.
        """
        if client_script is not None:
            raise NotImplementedError(
                "apply(client_script=...) is not supported by danaus: run the controller "
                "yourself (inside the allocation if you like) and call job.state()"
            )
        if self._status is JobStatus.NOT_RUNNING:
            self._create()
            self._apply_id = str(uuid.uuid4())
            self._status = JobStatus.RUNNING

    def state(self, cached_path: str | None = None) -> JobState:
        """The job's host meshes, applying the job first if it is not running.

        It blocks until the job runs and its hosts are attached, as Monarch's does; from
        async code, ``await asyncio.to_thread(job.state)``.

        Args:
            cached_path: where to keep the job for later controllers. When given and it
                holds a saved job that can run this spec, that allocation is reused;
                otherwise the job is applied and saved there. A saved job outlives this
                controller (see the subclass for how long). Unlike Monarch, whose
                default is ``.monarch/job_state.pkl``, nothing is saved by default, and
                the job ends with the controller.
        """
        if self._status is JobStatus.NOT_RUNNING and cached_path is not None:
            cached = self._load_cached(cached_path)
            if cached is not None:
                self._cached = cached
                self._status = JobStatus.CACHED
                log.info("reusing the job saved at %s", cached_path)
        if self._status is JobStatus.NOT_RUNNING:
            self.apply()
        running = self._running
        assert running is not None
        state = running._state()  # noqa: SLF001 - a JobTrait's own
        if cached_path is not None:
            running._keep()  # noqa: SLF001 - a JobTrait's own
            running.dump(cached_path)
        for name, url in self._services_of().start().items():
            setattr(state, name, url)
        return state

    def kill(self) -> None:
        """End the job (its allocation), whoever made it."""
        running = self._running
        if running is not None:
            running._kill()  # noqa: SLF001 - a JobTrait's own
        self._status = JobStatus.NOT_RUNNING
        self._cached = None

    def dump(self, filename: str) -> None:
        """Save the job to ``filename`` (following a symlink there), for :func:`job_load`."""
        path = os.path.realpath(filename)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump(self, f)
        os.replace(tmp, path)

    def dumps(self) -> bytes:
        return pickle.dumps(self)

    def _load_cached(self, path: str) -> JobTrait | None:
        try:
            job = job_load(path)
        except FileNotFoundError:
            return None
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as e:
            log.warning("ignoring the unreadable saved job at %s: %s", path, e)
            return None
        if not job.active:
            return None
        if not job.can_run(self):
            log.info("the job saved at %s cannot run this spec (or has ended): ending it", path)
            job._kill()  # noqa: SLF001 - a JobTrait's own
            try:
                os.remove(os.path.realpath(path))
            except FileNotFoundError:
                pass
            return None
        return job

    def mesh_sizes(self) -> dict[str, dict[str, int]] | None:
        """The host meshes this spec asks for, each as its dims' sizes
        (``{"trainers": {"hosts": 2}}``), known without applying the job: what a command
        aimed at the job is checked against before anything starts. None where the spec
        does not say (a subclass that does not tell)."""
        return None

    def _keep(self) -> None:  # noqa: B027 - optional hook
        """The job was saved for later controllers: let it outlive this one."""

    @abstractmethod
    def _create(self) -> None:
        """Submit the job (``apply`` sets the status afterwards)."""

    @abstractmethod
    def _state(self) -> JobState:
        """Connect to the running job: its host meshes by name."""

    @abstractmethod
    def _kill(self) -> None:
        """End the job's allocation."""

    @abstractmethod
    def can_run(self, spec: JobTrait) -> bool:
        """Can this (running) job serve ``spec``: the same request, and still alive?"""


def job_load(filename: str = DEFAULT_JOB_PATH) -> JobTrait:
    """A job saved by :meth:`JobTrait.dump` (or ``state(cached_path=...)``)."""
    with open(filename, "rb") as f:
        job = pickle.load(f)
    if not isinstance(job, JobTrait):
        raise TypeError(f"{filename} holds {a_type(job)}, not a saved job")
    return job


def job_loads(data: bytes) -> JobTrait:
    """A job saved by :meth:`JobTrait.dumps`."""
    job = pickle.loads(data)
    if not isinstance(job, JobTrait):
        raise TypeError(f"the data holds {a_type(job)}, not a saved job")
    return job
