"""An optional Prometheus endpoint (``prometheus-client``) for ``watch`` and ``monitor``.

Metrics are computed when scraped, from a callback: nothing runs between scrapes.
A private registry keeps them out of the process-wide default one, so two
endpoints (or a user's own metrics) never collide.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from unimem.errors import BackendUnavailable, ConfigError, UnimemWarning

__all__ = ["Gauge", "Server", "serve"]

CLOSE_WAIT = 10.0  # seconds close() waits for the scrapes in flight (each reads the figures once)


@dataclass(frozen=True)
class Gauge:
    name: str
    help: str
    labels: dict[str, str]
    value: int | float | None  # None (unknown) is left out of the scrape, never sent as 0


class _Scrapes:
    """The scrapes in flight, so that ``close()`` returns only once none is still reading figures."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running = 0
        self._closed = False

    def begin(self) -> bool:
        """Count one scrape in; False once closed (the scrape then reads nothing)."""
        with self._changed:
            if self._closed:
                return False
            self._running += 1
            return True

    def end(self) -> None:
        with self._changed:
            self._running -= 1
            self._changed.notify_all()

    def close(self) -> None:
        """Refuse new scrapes and wait (up to ``CLOSE_WAIT``) for those in flight."""
        with self._changed:
            self._closed = True
            self._changed.wait_for(lambda: self._running == 0, CLOSE_WAIT)


class Server:
    """A running endpoint: ``host`` and ``port`` (the bound ones), ``url`` and ``close()``."""

    def __init__(self, server: Any, thread: Any, scrapes: _Scrapes | None = None) -> None:
        self._server = server
        self._thread = thread
        self._scrapes = scrapes or _Scrapes()
        self.port: int = int(server.server_address[1])
        self.host: str = str(server.server_address[0])

    @property
    def url(self) -> str:
        """Where the metrics are read: ``http://127.0.0.1:9400/metrics``, ``http://[::]:9400/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address is bracketed in a URL
        return f"http://{host}:{self.port}/metrics"

    @property
    def every_interface(self) -> bool:
        """Whether it listens on every interface (``0.0.0.0``, ``::``): other machines can read it."""
        return _unspecified(self.host)

    def close(self) -> None:
        """Stop serving. Scrapes in flight finish first, and no callback runs after this returns."""
        self._scrapes.close()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _unspecified(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_unspecified
    except ValueError:  # a name, not an address
        return False


def serve(collect: Callable[[], list[Gauge]], port: int = 9400, host: str = "127.0.0.1") -> Server:
    """Serve ``collect()``'s gauges at ``http://host:port/metrics`` (``port=0``: any free port).

    Raises:
        ConfigError: ``port`` is not 0-65535, is in use or needs privileges (the message says
            which); ``host`` does not resolve or is not an address of this machine.
        BackendUnavailable: ``prometheus-client`` is not installed.

    Warns:
        UnimemWarning: ``host`` is every interface (``0.0.0.0``, ``::``): anyone who can reach
            the machine can read the figures.
    """
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
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(
            "host", f"cannot resolve {host!r} ({why}); pass an address of this machine, e.g. 127.0.0.1"
        ) from None
    scrapes = _Scrapes()

    class _Collector:
        def collect(self) -> Iterator[Any]:
            if not scrapes.begin():
                return  # closing: the figures' sources may be gone
            try:
                gauges = collect()
            finally:
                scrapes.end()
            families: dict[str, Any] = {}
            for gauge in gauges:
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
        raise _bind_error(exc, host, port) from None
    done = Server(server, thread, scrapes)
    if done.every_interface:
        warnings.warn(
            f"prometheus: {done.url} listens on every interface: anyone who can reach this machine can read "
            "its memory figures; bind 127.0.0.1 unless that is what you want",
            UnimemWarning,
            stacklevel=2,
        )
    return done


def _bind_error(exc: OSError, host: str, port: int) -> ConfigError:
    """Why ``host:port`` cannot be listened on, blaming the part that is wrong."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return ConfigError("port", f"port {port} is in use on {host}; pick another port (0: any free one)")
    if exc.errno == errno.EACCES:
        return ConfigError("port", f"cannot listen on {where}: permission denied; pick a port above 1023")
    if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
        return ConfigError(
            "host", f"{host} is not an address of this machine ({exc.strerror}); pass one, e.g. 127.0.0.1"
        )
    return ConfigError("port", f"cannot listen on {where} ({exc.strerror or exc}); pick another port")
