"""Crash recovery of the nightly job: a process killed at any step leaves nothing that blocks,
duplicates or misreports the next run.

What a ``kill -9`` can leave behind, and who cleans it up:

- a history row ``running`` under a claim nobody refreshes: the validating process refreshes its
  claims every ``claim_stale_after_s / 10`` seconds (:class:`Heartbeat`), and a process lease file
  (:class:`NightlyLease`, under ``<SPECDEC_HOME>/leases``) names the claims it holds; a claim whose
  holder process is dead on this host is taken over at once (:func:`holder_dead`), one on another
  host once its heartbeat is older than ``claim_stale_after_s``;
- a Prefect flow run left ``Running``: the next ``nightly run`` marks the runs of dead leases
  ``Crashed`` (:func:`crash_dead_flow_runs`);
- the Prefect API server ``nightly run`` started: it is our child with a parent-death signal on
  Linux (:mod:`flows.prefect_api`), so it dies with us; elsewhere the next run stops it
  (:func:`reap_dead_leases`);
- an MLflow run left ``RUNNING``: :func:`registry.runs.log_validation` tags runs with the history
  key and ends stale runs of the same key (one finished MLflow run per night);
- an alert row left ``sending``: :func:`monitoring.alerts.deliver_pending` takes it over after the
  longest possible send (one duplicate at most).

``SPECDEC_TEST_PAUSE_AT=<step>`` (tests only) makes :func:`checkpoint` stop the process at that
step so a test can ``kill -9`` it there; steps: ``validation``, ``history``, ``mlflow``,
``alerting``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import psutil


log = logging.getLogger(__name__)


def process_create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def process_alive(pid: int, create_time: float | None) -> bool:
    """True when ``pid`` runs and is the same process (same start time, so a reused pid is dead)."""
    ct = process_create_time(pid)
    if ct is None:
        return False
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.Error:
        return False
    return create_time is None or abs(ct - create_time) < 1.0


@dataclass
class NightlyLease:
    """What one nightly process holds, in ``<home>/leases/nightly-<pid>.json`` (host-local facts).

    Attributes:
        pid / create_time / host: the process. flow_run_id: its Prefect flow run, once known.
        server_pid / server_create_time: the Prefect API server it started, if any.
        claims: ``[history run id, claim token]`` pairs it holds.
    """

    pid: int
    create_time: float
    host: str
    flow_run_id: str | None = None
    server_pid: int | None = None
    server_create_time: float | None = None
    claims: list[list] = field(default_factory=list)
    path: str = ""

    @classmethod
    def mine(cls, home: Path | str) -> "NightlyLease":
        """The lease of this process (read back if it exists, else new and written)."""
        d = Path(home) / "leases"
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"nightly-{os.getpid()}.json"
        ct = process_create_time(os.getpid()) or time.time()
        if path.exists():
            lease = cls.read(path)
            if lease is not None and abs(lease.create_time - ct) < 1.0:
                return lease
        lease = cls(os.getpid(), ct, socket.gethostname(), path=str(path))
        lease.save()
        return lease

    @classmethod
    def read(cls, path: Path) -> "NightlyLease | None":
        try:
            d = json.loads(Path(path).read_text())
            d["path"] = str(path)
            return cls(**d)
        except (OSError, ValueError, TypeError):
            return None

    def save(self) -> None:
        """Write atomically (a crash mid-write never leaves half a lease)."""
        p = Path(self.path)
        tmp = p.with_suffix(f".tmp{os.getpid()}")
        d = asdict(self)
        d.pop("path")
        tmp.write_text(json.dumps(d))
        os.replace(tmp, p)

    def add_claim(self, run_id: int, token: str) -> None:
        self.claims.append([int(run_id), token])
        self.save()

    def drop_claim(self, run_id: int) -> None:
        self.claims = [c for c in self.claims if c[0] != int(run_id)]
        self.save()

    def alive(self) -> bool:
        return self.host != socket.gethostname() or process_alive(self.pid, self.create_time)

    def release(self) -> None:
        """Remove the lease file (normal exit). A lease that still names claims is kept: the process
        ended without recording or freeing them (e.g. the history DB went down and ``mark_error``
        failed), and the next run must see a dead holder and take them over at once, not wait for
        the stale-claim window and report "already-running".

        The claims are read back from the file first: the flow and the CLI each hold a
        :class:`NightlyLease` of the same process (:meth:`mine`), and only the file is current."""
        on_disk = self.read(Path(self.path)) if self.path else None
        if on_disk is not None:
            self.claims = on_disk.claims
        if self.claims:
            log.warning("nightly pid %d ends holding history claim(s) %s; the next run takes them over",
                        self.pid, ", ".join(str(c[0]) for c in self.claims))
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass


def leases(home: Path | str) -> list[NightlyLease]:
    """Every readable lease under ``<home>/leases``."""
    d = Path(home) / "leases"
    if not d.is_dir():
        return []
    return [x for x in (NightlyLease.read(p) for p in sorted(d.glob("nightly-*.json"))) if x is not None]


def dead_leases(home: Path | str) -> list[NightlyLease]:
    """Leases of this host whose process is gone (killed, crashed)."""
    host = socket.gethostname()
    return [x for x in leases(home) if x.host == host and x.pid != os.getpid() and not x.alive()]


def holder_dead(home: Path | str) -> Callable[[int, str], bool]:
    """For :func:`monitoring.history.claim_run`: ``f(run_id, token)`` is True when a dead process
    of this host held that claim (so it can be taken over at once, without waiting for staleness)."""
    def check(run_id: int, token: str) -> bool:
        return any([int(run_id), token] in x.claims for x in dead_leases(home))
    return check


def reap_dead_leases(home: Path | str) -> list[NightlyLease]:
    """Stop Prefect API servers left by dead nightly processes of this host (pid and start time
    checked, so an unrelated process that reused the pid is never touched).

    Returns the dead leases (their files are kept until :func:`crash_dead_flow_runs` handled them).
    """
    dead = dead_leases(home)
    for lease in dead:
        if lease.server_pid and process_alive(lease.server_pid, lease.server_create_time):
            try:
                p = psutil.Process(lease.server_pid)
                p.terminate()
                p.wait(10)
            except psutil.TimeoutExpired:
                p.kill()
            except psutil.Error:
                pass
            log.warning("stopped the Prefect API server (pid %d) left by crashed nightly pid %d",
                        lease.server_pid, lease.pid)
    return dead


def crash_dead_flow_runs(home: Path | str, dead: list[NightlyLease] | None = None) -> list[str]:
    """Mark the Prefect flow runs of dead nightly processes ``Crashed`` (they stay ``Running``
    forever otherwise) and remove their lease files. Needs the Prefect API.

    Returns the flow run ids marked.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    done = []
    dead = dead_leases(home) if dead is None else dead
    if not dead:
        return done
    with get_client(sync_client=True) as client:
        for lease in dead:
            if lease.flow_run_id:
                try:
                    fr = client.read_flow_run(lease.flow_run_id)
                    if fr.state is not None and fr.state.type in (StateType.RUNNING, StateType.PENDING):
                        client.set_flow_run_state(
                            lease.flow_run_id, Crashed(message=f"nightly process {lease.pid} died (killed); "
                                                       "marked by the next nightly run"), force=True)
                        done.append(lease.flow_run_id)
                        log.warning("flow run %s of dead nightly pid %d marked Crashed",
                                    lease.flow_run_id, lease.pid)
                except Exception as e:  # noqa: BLE001 (a missing run must not stop tonight's work)
                    log.warning("could not mark flow run %s Crashed: %s", lease.flow_run_id, e)
            lease.flow_run_id = None
            if lease.claims:
                lease.save()
            else:
                lease.release()
    return done


def forget_claim(home: Path | str, run_id: int) -> None:
    """A claim of a dead process was taken over: drop it from the dead leases (and remove a dead
    lease left with nothing to recover whose flow run is already handled)."""
    for lease in dead_leases(home):
        if any(c[0] == int(run_id) for c in lease.claims):
            lease.drop_claim(run_id)
            if not lease.claims and lease.flow_run_id is None:
                lease.release()


def crash_dead_claims(home: Path | str, db, *, stale_after_s: float) -> list[int]:
    """Rows left ``running`` by nightly processes that died become ``crashed`` with their reason: the claims of
    this host's dead leases at once (the process is gone: killed, SIGTERM), any host's once their heartbeat is
    older than ``stale_after_s`` seconds (:func:`monitoring.history.crash_stale_runs`). Without this a row whose
    key no later night claims again (another method, config or alias) stayed ``running`` for good.

    Returns the history row ids marked. Raises SQLAlchemy's errors when the store cannot be written.
    """
    from monitoring import history

    marked = []
    for lease in dead_leases(home):
        for run_id, token in list(lease.claims):
            why = (f"the nightly process {lease.pid} on {lease.host} died (killed or stopped) while it held this run; "
                   "nothing was recorded. Marked by a later nightly run")
            if history.mark_crashed(db, int(run_id), str(token), why):
                marked.append(int(run_id))
            forget_claim(home, int(run_id))
    return marked + history.crash_stale_runs(db, stale_after_s=stale_after_s)


class Heartbeat:
    """Refresh history claims every ``interval_s`` seconds in a daemon thread while the flow works.

    A claim whose heartbeat stops (the process died) goes stale after ``claim_stale_after_s``.
    Errors are logged, never raised (a lost claim is detected when the run is recorded).
    """

    def __init__(self, db, interval_s: float) -> None:
        self.db, self.interval_s = db, max(float(interval_s), 0.5)
        self.claims: dict[int, object] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, claim) -> None:
        with self._lock:
            self.claims[claim.run_id] = claim

    def remove(self, run_id: int) -> None:
        with self._lock:
            self.claims.pop(run_id, None)

    def _run(self) -> None:
        from monitoring import history

        while not self._stop.wait(self.interval_s):
            with self._lock:
                claims = list(self.claims.values())
            for c in claims:
                try:
                    history.heartbeat(self.db, c)
                except Exception as e:  # noqa: BLE001 (a background thread: any error drops that claim, never kills the thread)
                    log.warning("heartbeat of history run %s failed: %s", c.run_id, e)
                    self.remove(c.run_id)

    def __enter__(self) -> "Heartbeat":
        self._thread = threading.Thread(target=self._run, name="specdec-claim-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
