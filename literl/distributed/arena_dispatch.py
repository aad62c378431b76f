"""`literl ablate --cluster ADDRESS|local`: each planned run of an ablation as a Ray task on a cluster.

* A task asks for the run's resources (`num_cpus=--cpus-per-run`, `num_gpus=--gpus-per-run`); Ray places it on
  a node with them free and queues the rest, and gives it its GPUs as `CUDA_VISIBLE_DEVICES`. A run that itself
  uses `cluster.*` (its trainer ranks and rollout workers as Ray actors) is a Ray driver: its task asks for one CPU
  and no GPU, and the run joins this same cluster (`cluster.address=` its address), where its actors ask for the
  CPUs and GPUs its `cluster.*` keys give them. The task runs the
  same `literl train` command line as the local runner (literl.arena.spec.PlannedRun.command), with
  `trainer.threads` = its CPUs, so a run's metrics do not depend on where it ran.
* Run folders live on storage every node sees at the same path (the task writes there, the runner reads the
  progress there, and a run resumed on another node needs its checkpoints). Before anything runs, one probe task
  per node looks for a file the runner just wrote in the ablation folder; a node that cannot see it is named
  and the ablation refused.
* Resumable as the local runner is: finished runs (summary.json) are skipped, others resume from their newest
  checkpoint (`trainer.resume=true`, the runner's prepare_directory clears a run that never saved one). A task
  whose worker or node dies is retried by Ray (`max_retries`) on any node with the resources, and resumes from
  the run's last checkpoint there: the trainer child gets SIGTERM when its task's worker dies, saves and exits,
  and the retry waits for the run directory's lock before it starts.
* A live table (run, node, step, ETA, state) is redrawn while the tasks run. Ctrl-C cancels the queued tasks
  and asks the running ones to stop: each sends its trainer SIGTERM (it saves a checkpoint and exits).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from literl.arena.runner import Outcome, POLL_SECONDS, _die_with_parent, prepare_directory, steps_logged
from literl.arena.runs import is_finished
from literl.arena.spec import PlannedRun
from literl.arena.summary import LOG_NAME
from literl.distributed.cluster import ClusterError, check_reachable, import_ray
from literl.run.provenance import available_cpus

PLACEMENT_FILE = "placement.json"    # in each run directory: the node, worker pid, GPUs and attempt of its task
LOCK_WAIT_SECONDS = 600
DEFAULT_RETRIES = 3
FORWARDED_ENV_PREFIX = "LITERL_"
DRIVER_CPUS = 1       # what a run that starts its own actors asks for itself: its loop, metrics and checkpoints


# ---------------------------------------------------------------------------------------------- the task
def train_run(run: PlannedRun, python: str, threads: int, env_vars: dict[str, str],
              cluster_address: str | None = None) -> dict:
    """One run as a Ray task, on whatever node Ray chose (module docstring); `cluster_address` for a run that
    starts Ray actors of its own, on this cluster."""
    import ray

    directory = run.directory
    directory.mkdir(parents=True, exist_ok=True)
    _wait_for_lock(directory)
    previous = _read_placement(directory)
    start_step = prepare_directory(run)
    gpus = [str(g) for g in ray.get_gpu_ids()]
    placement = {"node": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id(),
                 "pid": os.getpid(), "gpus": gpus, "start_step": start_step, "started": time.time(),
                 "attempt": int(previous.get("attempt", 0)) + 1 if previous else 1}
    _write_json_atomic(directory / PLACEMENT_FILE, placement)
    env = {**os.environ, **env_vars, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false"}
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    command = run.command(python, threads) + ([f"cluster.address={cluster_address}"] if cluster_address else [])
    with open(directory / LOG_NAME, "a") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} literl ablate --cluster on {placement['node']} "
                  f"(attempt {placement['attempt']}): {' '.join(command)}\n")
        log.flush()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   start_new_session=True, preexec_fn=_die_with_parent)
        try:
            code = process.wait()
        except KeyboardInterrupt:          # ray.cancel: let the trainer save a checkpoint, then report
            process.send_signal(signal.SIGTERM)
            code = process.wait()
    return {"code": code, "node": placement["node"], "finished": is_finished(directory)}


def _wait_for_lock(directory: Path) -> None:
    """A retried task may start while the trainer of the attempt before (orphaned when its worker died) still
    saves its checkpoint: wait until it has let go of the run directory."""
    from literl.run.lock import DirectoryBusy, DirectoryLock

    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while True:
        try:
            DirectoryLock(directory).acquire().release()
            return
        except DirectoryBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def sees_file(path: str, token: str) -> bool:
    """On one node: whether the probe file the runner wrote is there with its token."""
    try:
        return Path(path).read_text() == token
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------- the runner
def connect(address: str):
    """Ray as `--cluster` asks: a Ray already started in this process as it is, a local cluster with this
    machine's CPUs, or a running cluster's address."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    options = dict(include_dashboard=False, configure_logging=False, log_to_driver=False)
    if address != "local":
        check_reachable(address, named=f"--cluster {address}", local="--cluster local")
    try:
        if address == "local":
            ray.init(num_cpus=available_cpus(), **options)
        else:
            ray.init(address=address, **options)
    except Exception as err:  # noqa: BLE001 - Ray raises several types for a cluster it cannot join
        raise ClusterError(f"could not join the Ray cluster at --cluster {address}: {err}. Start its head with "
                           "`ray start --head` and give its address, or use --cluster local") from err
    return ray


def alive_nodes(ray) -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def check_resources(ray, cpus_per_run: float, gpus_per_run: float) -> None:
    """Refuse before anything runs when no node could ever hold one run (its task would wait forever)."""
    nodes = alive_nodes(ray)
    if any(n["Resources"].get("CPU", 0) >= cpus_per_run and n["Resources"].get("GPU", 0) >= gpus_per_run
           for n in nodes):
        return
    largest = ", ".join(f"{n['NodeManagerAddress']}: {n['Resources'].get('CPU', 0):g} CPUs, "
                        f"{n['Resources'].get('GPU', 0):g} GPUs" for n in nodes)
    raise ClusterError(f"each run asks for {cpus_per_run:g} CPUs and {gpus_per_run:g} GPUs, and no node of the "
                       f"cluster has that many ({largest}). Lower --cpus-per-run / --gpus-per-run, or add a node "
                       "that large")


def check_shared_storage(ray, folder: Path, *, write_token=None) -> None:
    """One probe task per alive node reads a file written here into `folder`; refused, naming the nodes, when any
    cannot. `write_token(path, token)` writes the probe (a test may make it write nothing)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    folder.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    probe = folder / f".storage-probe-{token}"
    (write_token or (lambda path, text: path.write_text(text)))(probe, token)
    try:
        nodes = alive_nodes(ray)
        task = ray.remote(num_cpus=0)(sees_file)
        refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(str(probe.resolve()), token) for n in nodes]
        seen = ray.get(refs, timeout=120)
    finally:
        probe.unlink(missing_ok=True)
    blind = [n["NodeManagerAddress"] for n, ok in zip(nodes, seen) if not ok]
    if blind:
        raise ClusterError(
            f"the ablation folder {folder.resolve()} is not visible from node(s) {', '.join(blind)}: every node "
            "writes its runs there, the runner reads their progress there, and a run resumed on another node needs "
            "its checkpoints there. Put --out on storage every node mounts at the same path (NFS or another shared "
            "filesystem), e.g. --out /shared/ablations/NAME")


def run_on_cluster(runs: list[PlannedRun], total_steps: dict[Path, int], *, address: str = "local",
                   cpus_per_run: int = 1, gpus_per_run: float = 0, console=None, python: str = sys.executable,
                   max_retries: int = DEFAULT_RETRIES, poll_seconds: float = POLL_SECONDS,
                   env_vars: dict[str, str] | None = None) -> Outcome:
    """Every planned run that is not finished, as Ray tasks (module docstring); returns what happened.
    `env_vars` are set for every trainer besides the worker's own environment (default: this process's
    LITERL_* variables, e.g. LITERL_CACHE_DIR, which a worker started before them would not have)."""
    from rich.console import Console

    console = console or Console(stderr=True)
    outcome = Outcome(skipped=[r for r in runs if is_finished(r.directory)])
    pending = [r for r in runs if not is_finished(r.directory)]
    if outcome.skipped:
        console.print(f"\\[arena] {len(outcome.skipped)} of {len(runs)} runs already finished: skipped",
                      highlight=False)
    if not pending:
        return outcome
    ray = connect(address)
    check_resources(ray, cpus_per_run, gpus_per_run)
    check_shared_storage(ray, Path(os.path.commonpath([str(r.directory.parent) for r in pending])))
    task = ray.remote(max_retries=max_retries)(train_run)
    address = cluster_address(ray)
    if env_vars is None:
        env_vars = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIX)}
    refs = {}
    for run in pending:
        if uses_cluster(run):       # a Ray driver: its actors ask for the resources, on this cluster
            refs[task.options(num_cpus=DRIVER_CPUS, num_gpus=0).remote(run, python, DRIVER_CPUS, env_vars,
                                                                        address)] = run
        else:
            refs[task.options(num_cpus=cpus_per_run, num_gpus=gpus_per_run).remote(run, python, cpus_per_run,
                                                                                env_vars)] = run
    table = LiveTable(pending, total_steps)
    stops: list[int] = []
    previous = _install_stop(ray, refs, stops, console)
    try:
        from rich.live import Live

        with Live(table.render(), console=console, refresh_per_second=2, transient=False) as live:
            while refs:
                done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=poll_seconds)
                for ref in done:
                    _settle(ray, ref, refs.pop(ref), outcome, table, stops, console)
                live.update(table.render())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    outcome.interrupted = bool(stops)
    return outcome


def uses_cluster(run: PlannedRun) -> bool:
    """Whether the run's own overrides start Ray actors (the last `cluster.address=` is set and not null)."""
    values = [o.split("=", 1)[1].strip() for o in run.overrides if o.split("=", 1)[0].strip() == "cluster.address"]
    return bool(values) and values[-1] not in ("", "null", "None", "~")


def cluster_address(ray) -> str:
    """The address a run started on this cluster joins it by (its GCS host:port)."""
    return ray.get_runtime_context().gcs_address


def _settle(ray, ref, run: PlannedRun, outcome: Outcome, table: "LiveTable", stops: list, console) -> None:
    name = f"{run.variant}/{run.scenario}/seed_{run.seed}"
    try:
        result = ray.get(ref)
    except Exception as err:  # noqa: BLE001 - cancelled, or a worker that died more often than max_retries
        if stops:
            table.states[run.directory] = "stopped"
            return
        outcome.failed.append((run, -1))
        table.states[run.directory] = "failed"
        console.print(f"\\[arena] [bold red]FAILED[/] {name} on the cluster: {str(err).strip().splitlines()[-1]}",
                      highlight=False)
        return
    if result["code"] == 0 and result["finished"]:
        outcome.finished.append(run)
        table.states[run.directory] = "finished"
    elif stops:
        table.states[run.directory] = "stopped"
    else:
        outcome.failed.append((run, result["code"]))
        table.states[run.directory] = "failed"
        console.print(f"\\[arena] [bold red]FAILED[/] {name} on {result['node']} (exit code {result['code']}); "
                      f"log: {run.directory / LOG_NAME}", highlight=False)


def _install_stop(ray, refs: dict, stops: list, console) -> dict:
    def stop(signum, frame):
        stops.append(signum)
        if len(stops) == 1:
            console.print("\n\\[arena] stopping: queued runs cancelled, running ones save a checkpoint and exit "
                          "(Ctrl-C again to kill them). Rerun the same command to continue.", highlight=False)
        for ref in list(refs):
            ray.cancel(ref, force=len(stops) > 1)

    try:
        return {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:      # not the main thread: the caller owns signals
        return {}


class LiveTable:
    """The runner's view of the runs: node and attempt from each run's placement.json, the step from its
    metrics.jsonl, the ETA from the step rate seen since the runner first saw the run train."""

    def __init__(self, runs: list[PlannedRun], total_steps: dict[Path, int]):
        self.runs, self.total_steps = runs, total_steps
        self.states: dict[Path, str] = {}
        self.first_seen: dict[Path, tuple[float, int]] = {}

    def row(self, run: PlannedRun) -> tuple[str, str, str, str, str]:
        placement = _read_placement(run.directory)
        total = self.total_steps.get(run.directory, 1)
        step = min(steps_logged(run.directory), total)
        state = self.states.get(run.directory)
        if state is None:
            attempt = int(placement.get("attempt", 1))
            state = "queued" if not placement else ("running" if attempt == 1 else f"resumed (attempt {attempt})")
        eta = ""
        if state.startswith(("running", "resumed")):
            seen_at, seen_step = self.first_seen.setdefault(run.directory, (time.monotonic(), step))
            rate = (step - seen_step) / max(1e-9, time.monotonic() - seen_at)
            eta = f"{(total - step) / rate:.0f} s" if rate > 0 else "…"
        return (f"{run.variant}/{run.scenario}/seed_{run.seed}", str(placement.get("node", "–")), f"{step}/{total}",
                eta, state)

    def render(self):
        from rich.table import Table

        table = Table(title="ablation on the cluster")
        for column in ("run", "node", "step", "ETA", "state"):
            table.add_column(column)
        for run in self.runs:
            table.add_row(*self.row(run))
        return table


def _read_placement(directory: Path) -> dict:
    try:
        data = json.loads((directory / PLACEMENT_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
