"""The Prometheus endpoint: its URL, what a bad port or host is blamed on, every interface said
aloud, and no scrape still reading figures once it is closed."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
import warnings
from typing import Any

import pytest

import unimem
from unimem.errors import ConfigError, UnimemWarning

prometheus = pytest.importorskip("prometheus_client")
from unimem.observe.prometheus import Gauge, serve  # noqa: E402


def _gauges() -> list[Gauge]:
    return [Gauge("unimem_test_bytes", "a figure", {}, 1)]


def _scrape(port: int, host: str = "127.0.0.1") -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def test_loopback_is_the_default_and_says_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        server = serve(_gauges, 0)
    try:
        assert server.url == f"http://127.0.0.1:{server.port}/metrics" and not server.every_interface
        assert "unimem_test_bytes 1.0" in _scrape(server.port)
    finally:
        server.close()


@pytest.mark.parametrize(("host", "shown"), [("0.0.0.0", "0.0.0.0"), ("::", "[::]")])
def test_every_interface_is_named_in_a_valid_url_and_warned_about(host: str, shown: str) -> None:
    if host == "::" and not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    with pytest.warns(UnimemWarning, match="listens on every interface"):
        server = serve(_gauges, 0, host)
    try:
        assert server.url == f"http://{shown}:{server.port}/metrics" and server.every_interface
    finally:
        server.close()


def test_a_port_in_use_is_blamed_on_the_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} is in use") as info:
            serve(_gauges, port)
    assert info.value.parameter == "port"


@pytest.mark.parametrize("host", ["no-such-host.invalid", "192.0.2.1"])
def test_a_bad_host_is_blamed_on_the_host(host: str) -> None:
    with pytest.raises(ConfigError) as info:
        serve(_gauges, 0, host)
    assert info.value.parameter == "host" and host in str(info.value)


def test_close_waits_for_the_scrape_in_flight_and_no_figure_is_read_after() -> None:
    reads: list[tuple[float, float]] = []
    started = threading.Event()

    def slow() -> list[Gauge]:
        begun = time.monotonic()
        started.set()
        time.sleep(0.5)
        reads.append((begun, time.monotonic()))
        return _gauges()

    server = serve(slow, 0)
    scrape = threading.Thread(target=_scrape, args=(server.port,))
    scrape.start()
    assert started.wait(10)
    server.close()
    closed = time.monotonic()
    scrape.join(10)
    assert reads and all(end <= closed for _, end in reads)


def test_scrapes_during_stop_plant_no_false_sampler_notes() -> None:
    stop = threading.Event()
    errors: list[BaseException] = []

    def hammer(port: int) -> None:
        while not stop.is_set():
            try:
                _scrape(port)
            except OSError:
                pass  # the endpoint closing under a scrape is expected
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

    notes: list[str] = []
    for _ in range(3):
        stop.clear()
        monitor: Any = unimem.monitor(0.01).start()
        port = monitor.serve_prometheus(port=0)
        scrapers = [threading.Thread(target=hammer, args=(port,)) for _ in range(4)]
        for thread in scrapers:
            thread.start()
        time.sleep(0.3)
        recording = monitor.stop()
        stop.set()
        for thread in scrapers:
            thread.join(10)
        notes += recording.notes
    assert not errors
    assert not [note for note in notes if "sampler process lost" in note], notes
