"""The services a job brings up with its state (Monarch's ``enable_admin`` and
``enable_telemetry``): the controller's admin endpoint (which ``danaus top``, ``danaus
debug`` and the dashboard attach to), OpenTelemetry traces and metrics in the
controller and the procs spawned from then on, and the dashboard's web page. Their
addresses go in the :class:`~danaus.job.JobState` (``admin_url``, ``telemetry_url``,
``dashboard_url``).
"""

from __future__ import annotations

import dataclasses

__all__ = ["MeshAdminConfig", "Services", "TelemetryConfig"]


@dataclasses.dataclass
class MeshAdminConfig:
    """The admin endpoint a job's ``state()`` starts (Monarch's ``MeshAdminConfig``).

    Args:
        admin_addr: where it listens (``config.admin``'s forms: ``unix:@name``,
            ``tcp://host:port``, a port on 127.0.0.1); None: ``config.admin``.
    """

    admin_addr: str | None = None


@dataclasses.dataclass
class TelemetryConfig:
    """What a job's ``state()`` starts for telemetry (Monarch's ``TelemetryConfig``):
    OpenTelemetry traces and metrics (``config.telemetry``, exported as the ``OTEL_*``
    variables say) and, with ``include_dashboard``, the dashboard's page on
    ``dashboard_port`` (0: a free one; the URL carries a token).

    ``retention_secs`` and ``snapshot_interval_secs`` size Monarch's own telemetry store;
    danaus keeps none (an OpenTelemetry backend does), so they are kept and change
    nothing.
    """

    retention_secs: int = 3600
    include_dashboard: bool = False
    dashboard_port: int = 8265
    snapshot_interval_secs: float = 30.0


#: dashboards this process started, by port asked for (one per process and port)
_dashboards: dict[int, str] = {}


@dataclasses.dataclass
class Services:
    """What ``enable_admin`` / ``enable_telemetry`` asked of a job."""

    admin: MeshAdminConfig | None = None
    telemetry: TelemetryConfig | None = None

    def start(self) -> dict[str, str | None]:
        """Bring them up in this controller (each once); their addresses."""
        urls: dict[str, str | None] = {
            "admin_url": None,
            "telemetry_url": None,
            "dashboard_url": None,
        }
        if self.telemetry is not None:
            from ..config import configure

            configure(telemetry=True)  # here, and in the procs spawned from now on
            from ..actors.seam import otlp_traces_url

            urls["telemetry_url"] = otlp_traces_url()
            if self.telemetry.include_dashboard:
                port = self.telemetry.dashboard_port
                if port not in _dashboards:
                    from ..mesh.seam import start_dashboard

                    _dashboards[port] = start_dashboard(port)
                urls["dashboard_url"] = _dashboards[port]
        if self.admin is not None:
            from ..config import config
            from ..mesh import serve_admin

            urls["admin_url"] = serve_admin(self.admin.admin_addr or config.admin).addr
        return urls
