"""Connecting to Ray: a local cluster started here, or a running one; clear errors when neither can be had.

This package is the only place literl imports `ray` (tests/test_structure.py checks it), and it imports it only
when `cluster.address` is set, so a single-process run never needs Ray installed.
"""

from __future__ import annotations

import atexit
import math
import os
import signal
import socket
import warnings
from typing import Any

from literl.run.provenance import available_cpus

INSTALL = "pip install 'literl[ray]'"


class ClusterError(RuntimeError):
    """A cluster that cannot be used (Ray missing, an unreachable address) or a part of it that died."""


class ClusterWarning(UserWarning):
    """A local cluster asks for more CPUs than this machine lets the run use."""


def import_ray():
    try:
        import ray
    except ImportError as err:
        raise ClusterError(f"cluster.address is set but Ray is not installed: {INSTALL} (./run.sh installs it "
                           f"when a command sets cluster.address)") from err
    return ray


def connect(cluster, *, threads: int | None = None):
    """`ray.init` as `cluster.address` asks; returns the `ray` module. A Ray already initialised in this process
    (a notebook, a test's cluster) is used as it is."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    address = str(cluster.address)
    # Actors ask for cluster.cpus_per_worker each; a local cluster offers at least that many logical CPUs (on a
    # small machine they share the cores: Ray's CPUs are a scheduling count, not a pinning).
    wanted = (cluster.trainer_ranks + cluster.rollout_workers) * cluster.cpus_per_worker
    options: dict[str, Any] = dict(include_dashboard=False, log_to_driver=True, configure_logging=False)
    if address == "local":
        _warn_if_oversubscribed(cluster, wanted)
        # The cluster's processes start with SIGINT ignored: Ctrl-C in a terminal reaches the whole foreground
        # process group, and the run must keep its cluster while it finishes the step and saves; the driver's
        # exit then shuts the cluster down (ray.shutdown), its actors with it.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if _main_thread() else None
        try:
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, math.ceil(wanted)), **options)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
    else:
        check_reachable(address)
        try:
            ray.init(address=address, **options)
        except Exception as err:  # noqa: BLE001 - Ray raises several types for a cluster it cannot join
            raise ClusterError(f"could not join the Ray cluster at cluster.address={address!r}: {err}. Start its "
                               f"head with `ray start --head`, or use cluster.address=local for a cluster on this "
                               f"machine") from err
    atexit.register(_shutdown, ray)
    return ray


def _warn_if_oversubscribed(cluster, wanted: float) -> None:
    """Each trainer rank and rollout worker is a process of its own (besides Ray's): a local cluster asking for far
    more CPUs than the machine has shares its cores among them all, and a probe's 64 ranks + 64 workers on 2 cores
    started 88+ processes and finished no step in 200 s, without a word."""
    cpus = available_cpus()
    if wanted <= cpus:
        return
    warnings.warn(
        f"cluster.address=local: {cluster.trainer_ranks} trainer ranks + {cluster.rollout_workers} rollout workers "
        f"at cluster.cpus_per_worker={cluster.cpus_per_worker:g} want {wanted:g} CPUs, and this machine lets the "
        f"run use {cpus} CPUs. Every rank and worker is a process: they will share the cores and each step will be "
        f"far slower than with fewer. Lower cluster.trainer_ranks and cluster.rollout_workers to fit the machine, "
        f"or give cluster.address of a larger Ray cluster", ClusterWarning, stacklevel=3)


def check_reachable(address: str, timeout_s: float = 5.0, *, named: str | None = None,
                    local: str = "cluster.address=local") -> None:
    """Fail within seconds on a host:port nothing listens on (ray.init would retry for a minute). `named`: how the
    user gave the address (default `cluster.address='...'`), `local`: how they ask for a cluster on this machine."""
    if address == "auto":
        return
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return      # a form ray.init understands and this check does not: let it decide
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as err:
        raise ClusterError(f"no Ray cluster answers at {named or f'cluster.address={address!r}'} ({err}). Start its "
                           f"head with `ray start --head --port={port}` on {host}, check the address, or use "
                           f"{local} for a cluster on this machine") from err


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


_ACTORS: list = []      # every actor this process started, stopped at its exit (Ctrl-C included)


def started(actor):
    """Note an actor this process started, so that its exit stops it (returns the actor)."""
    _ACTORS.append(actor)
    return actor


def _shutdown(ray) -> None:
    """At exit: stop this process's actors, then Ray. An actor whose owner is gone would be stopped by Ray too,
    but a local cluster's processes can go first (a terminal's Ctrl-C), leaving its actors' processes behind."""
    if not ray.is_initialized():
        return
    kill_actors(ray, _ACTORS)
    _ACTORS.clear()
    ray.shutdown()


def kill_actors(ray, actors) -> None:
    """Stop these actors; one already dead (or a Ray already shut down) is skipped."""
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone, or Ray already shut down
            pass


def node_address() -> str:
    """This process's address as other nodes of the cluster reach it."""
    ray = import_ray()
    return ray.util.get_node_ip_address()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def actor_options(cluster) -> dict:
    return {"num_cpus": cluster.cpus_per_worker, "num_gpus": cluster.gpus_per_worker, "max_restarts": 0}


def threads_for(cluster) -> int:
    return max(1, math.ceil(cluster.cpus_per_worker))


def wait_all(ray, refs: list, actors: list, what: str) -> list:
    """Results of one call per actor, in order. The first failure kills every other actor of the call (a peer
    blocked in a collective would otherwise wait for the dead one until its timeout) and raises ClusterError
    naming the actor."""
    pending = {ref: i for i, ref in enumerate(refs)}
    results: list = [None] * len(refs)
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        i = pending.pop(done[0])
        try:
            results[i] = ray.get(done[0])
        except Exception as err:  # noqa: BLE001 - RayActorError, RayTaskError: the actor's own error inside
            for j, actor in enumerate(actors):
                if j != i:
                    ray.kill(actor, no_restart=True)
            raise ClusterError(f"{what} {i} failed: {_cause(err)}") from err
    return results


def _cause(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[-1] if text else type(err).__name__
