"""An optional Prometheus endpoint (``prometheus-client``) for ``watch`` and ``monitor``.

Metrics are computed when scraped, from a callback: nothing runs between scrapes.
A private registry keeps them out of the process-wide default one, so two
endpoints (or a user's own metrics) never collide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from unimem.errors import BackendUnavailable, ConfigError

__all__ = ["Gauge", "Server", "serve"]


@dataclass(frozen=True)
class Gauge:
    name: str
    help: str
    labels: dict[str, str]
    value: int | float | None  # None (unknown) is left out of the scrape, never sent as 0


class Server:
    """A running endpoint: ``port`` (the bound one) and ``close()``."""

    def __init__(self, server: Any, thread: Any) -> None:
        self._server = server
        self._thread = thread
        self.port: int = int(server.server_address[1])
        self.host: str = str(server.server_address[0])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def serve(collect: Callable[[], list[Gauge]], port: int = 9400, host: str = "127.0.0.1") -> Server:
    """Serve ``collect()``'s gauges at ``http://host:port/metrics`` (``port=0``: any free port)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError("port", f"expected a TCP port (0-65535), got {port!r}")
    if not isinstance(host, str) or not host:
        raise ConfigError("host", f"expected an address to bind, got {host!r}")
    try:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.core import GaugeMetricFamily
    except ImportError:
        raise BackendUnavailable(
            "prometheus: the prometheus-client package is not installed; pip install prometheus-client"
        ) from None

    class _Collector:
        def collect(self) -> Iterator[Any]:
            families: dict[str, Any] = {}
            for gauge in collect():
                if gauge.value is None:
                    continue
                family = families.get(gauge.name)
                if family is None:
                    family = GaugeMetricFamily(gauge.name, gauge.help, labels=sorted(gauge.labels))
                    families[gauge.name] = family
                family.add_metric([gauge.labels[key] for key in sorted(gauge.labels)], float(gauge.value))
            yield from families.values()

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigError("port", f"cannot listen on {host}:{port} ({exc}); pick another port") from None
    return Server(server, thread)
