"""`hetrl profile hosts.txt`: probe every host over SSH (in parallel), measure host↔host links (one pair at a
time), and assemble a ClusterProfile.

Phases: 1) parse hosts.txt and the links file (bad input fails before any connection); 2) connect and run
the probe on all hosts in parallel, then run their benchmarks in lockstep (probe_together), each step
under the timeout; 3) measure links pair by pair with `netbench` (a spanning sample beyond 8 hosts);
4) apply link overrides; 5) build the profile, or raise RemoteError naming every host that failed.

Nothing from hosts.txt reaches a shell unquoted: remote commands are built from argument lists with
shlex.quote, and a local host runs its probe as an argument list without a shell.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from hetrl_cli.artifacts.hosts import HostEntry, load_hosts
from hetrl_cli.artifacts.profile import ClusterProfile, Device, Host, IntraLink, Link, LinkKind
from hetrl_cli.errors import RemoteError
from hetrl_cli.profiling.links import LinkOverride, apply_overrides, fully_given, load_link_overrides
from hetrl_cli.profiling.probe import GO_LINE, QUICK_ENV
from hetrl_cli.remote.ssh import (
    CommandTimeout,
    Completed,
    HostFailure,
    KnownHosts,
    SshSettings,
    connect,
    host_python,
)
from hetrl_cli.remote.ssh import remote_command as remote_command  # re-exported: tests and callers use it here
from hetrl_cli.remote.sshconfig import SshConfig

FULL_MEASURE_PAIRS_UP_TO = 8
"""Up to this many hosts every pair is measured; beyond it a sample (see `choose_pairs`)."""
LINK_PHASE_BUDGET_S = 120.0
"""Wall-clock cap on the whole link phase; pairs not reached in time are inferred (noted in the profile)."""
NETBENCH_FULL = {"pings": 20, "max_bytes": 64 << 20, "max_seconds": 1.0}
NETBENCH_QUICK = {"pings": 10, "max_bytes": 8 << 20, "max_seconds": 0.2}


@dataclass
class ProfileOptions:
    """What `hetrl profile` passes in from its flags."""

    timeout_s: float = 60.0
    """Limit for each remote operation (connect, probe, one link measurement)."""
    accept_new_host_keys: bool = False
    """Add keys of hosts missing from known_hosts (each is reported); a changed key is always an error."""
    known_hosts: Path | None = None
    """known_hosts file; None = ~/.ssh/known_hosts."""
    allow_partial: bool = False
    """Write a profile without the hosts that failed (marked `missing`) instead of failing."""
    links_file: Path | None = None
    """YAML of link facts that override or add to the measured ones."""
    name: str | None = None
    """Profile name; None = the hosts file's stem."""
    quick: bool | None = None
    """Tiny microbenchmarks (tests); None = from the HETRL_PROBE_QUICK environment variable."""
    ssh_config: Path | None = None
    """ssh config file naming the hosts; None = ~/.ssh/config (when it exists)."""
    use_ssh_config: bool = True
    """False (--no-ssh-config): hosts.txt alone says how to reach each host."""


# ---- running commands on a host --------------------------------------------------------------------------


class Started(Protocol):
    """A long-running command (the netbench server, a --together probe) that the launcher talks to by lines."""

    def readline(self, timeout_s: float) -> str: ...
    def stderr_text(self) -> str: ...
    def send(self, text: str) -> None: ...
    def finish(self, timeout_s: float) -> Completed: ...
    def close(self) -> None: ...


class Executor(Protocol):
    def run(self, argv: list[str], timeout_s: float) -> Completed: ...
    def start(self, argv: list[str], timeout_s: float) -> Started: ...
    def close(self) -> None: ...


class LocalExecutor:
    """Runs commands on this machine as argument lists, without a shell."""

    def run(self, argv: list[str], timeout_s: float) -> Completed:
        argv = [os.path.expanduser(argv[0]), *argv[1:]]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise CommandTimeout from None
        except FileNotFoundError:
            return Completed(127, "", f"{argv[0]}: not found")
        return Completed(done.returncode, done.stdout, done.stderr)

    def start(self, argv: list[str], timeout_s: float) -> Started:
        argv = [os.path.expanduser(argv[0]), *argv[1:]]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return _LocalStarted(proc)

    def close(self) -> None:
        pass


class _LocalStarted:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def readline(self, timeout_s: float) -> str:
        assert self.proc.stdout is not None
        data = b""
        deadline = time.monotonic() + timeout_s
        while not data.endswith(b"\n"):
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise CommandTimeout
            part = os.read(self.proc.stdout.fileno(), 4096)
            if not part:
                break
            data += part
        return data.decode(errors="replace")

    def stderr_text(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""  # still running: reading its stderr would block
        return self.proc.stderr.read().decode(errors="replace")

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def finish(self, timeout_s: float) -> Completed:
        """As _SshStarted.finish: close stdin, wait for the exit, return the status and the unread output."""
        try:
            out, err = self.proc.communicate(timeout=timeout_s)
            rc = self.proc.returncode
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            rc = -1
        return Completed(rc, out.decode(errors="replace"), err.decode(errors="replace"))

    def close(self) -> None:
        # Closing stdin makes the server exit (--exit-on-eof); kill it if it does not within a second.
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()


# ---- probing ----------------------------------------------------------------------------------------------


def probe_argv(entry: HostEntry, quick: bool) -> list[str]:
    argv = [host_python(entry), "-m", "hetrl_cli.profiling.probe"]
    if entry.gpus is not None:
        argv += ["--gpus", ",".join(str(i) for i in entry.gpus)]
    elif entry.slots is not None:
        argv += ["--slots", str(entry.slots)]
    return [*argv, "--quick"] if quick else argv


def _json_object(line: str) -> dict[str, Any]:
    """`line` parsed as a JSON object; {} for anything else."""
    try:
        data = json.loads(line)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def explain_probe_failure(done: Completed, python: str) -> str:
    """Why the probe produced no usable JSON, from its exit code and output."""
    err = done.stderr.strip()
    last = err.splitlines()[-1] if err else ""
    if done.rc == 127 or (done.rc != 0 and "No such file or directory" in err and python in err):
        return f"python {python!r} not found: set python= in hosts.txt to an interpreter that has hetrl installed"
    if "No module named" in err and "hetrl_cli" in err:
        return f"hetrl is not installed for {python}: pip install hetrl on that host, or set python= in hosts.txt"
    error = _json_object(done.stdout).get("error")
    if error:
        return f"probe: {error}"
    if done.rc != 0:
        return f"probe crashed (exit {done.rc}): {last or 'no error output'}"
    return f"probe printed no JSON object on stdout (got {done.stdout[:80]!r})"


def _probe_failure(handle: Started, first: str, entry: HostEntry, timeout_s: float) -> HostFailure:
    """Why a started probe printed `first` instead of what was expected, from all it said and its exit."""
    done = handle.finish(timeout_s)
    return HostFailure(explain_probe_failure(Completed(done.rc, first + done.stdout, done.stderr), host_python(entry)))


def start_probe(executor: Executor, entry: HostEntry, quick: bool, timeout_s: float) -> Started:
    """Start the probe with --together and wait until it is ready to benchmark (torch imported, devices
    found): every host's benchmarks then start at one `go` (profile_hosts)."""
    argv = [*probe_argv(entry, quick), "--together"]
    try:
        handle = executor.start(argv, timeout_s)
    except FileNotFoundError:
        raise HostFailure(explain_probe_failure(Completed(127, "", f"{argv[0]}: not found"), argv[0])) from None
    try:
        line = handle.readline(timeout_s)
    except CommandTimeout:
        handle.close()
        raise HostFailure(f"probe was not ready within {timeout_s:g}s (raise --timeout)") from None
    if not _json_object(line).get("ready"):
        raise _probe_failure(handle, line, entry, timeout_s)
    return handle


def next_stage(handle: Started, entry: HostEntry, timeout_s: float) -> dict[str, Any] | None:
    """After `go`: None when the probe is ready for its next benchmark stage, else its facts."""
    try:
        line = handle.readline(timeout_s)
    except CommandTimeout:
        raise HostFailure(f"probe did not finish within {timeout_s:g}s (raise --timeout)") from None
    data = _json_object(line)
    if data.get("ready"):
        return None
    if "devices" not in data:
        raise _probe_failure(handle, line, entry, timeout_s)
    return data


@dataclass
class HostRun:
    """One host through the run: its entry, its connection, its running probe, what the probe said or why
    it failed."""

    entry: HostEntry
    executor: Executor | None = None
    probe: Started | None = None
    facts: dict[str, Any] | None = None
    error: str | None = None


def _guarded(run: HostRun, report: Callable, step: Callable[[], None]) -> None:
    """Run one step of a host's probing; a failure becomes the host's `error`, never an exception."""
    try:
        step()
    except HostFailure as exc:
        run.error = str(exc)
        report(run.entry.name, "failed")
    except Exception as exc:  # anything unexpected still names the host instead of killing the others
        run.error = f"{type(exc).__name__}: {exc}"
        report(run.entry.name, "failed")


def prepare_one(entry: HostEntry, ssh: SshSettings, quick: bool, timeout_s: float, report: Callable) -> HostRun:
    """Connect (unless local) and start the probe on one host, up to its ready line."""
    run = HostRun(entry)

    def step() -> None:
        if entry.is_local:
            run.executor = LocalExecutor()
        else:
            report(entry.name, "connecting")
            run.executor = connect(entry, ssh, timeout_s)
        report(entry.name, "starting probe")
        run.probe = start_probe(run.executor, entry, quick, timeout_s)
        report(entry.name, "ready")

    _guarded(run, report, step)
    return run


def probe_stage(run: HostRun, timeout_s: float, report: Callable) -> None:
    """Say `go` to a waiting probe and wait until it is ready for its next stage or has printed its facts."""

    def step() -> None:
        assert run.probe is not None
        report(run.entry.name, "probing")
        run.probe.send(GO_LINE + "\n")
        run.facts = next_stage(run.probe, run.entry, timeout_s)
        if run.facts is not None:
            count = len(run.facts["devices"])
            report(run.entry.name, "done", f"{count} device{'s' if count != 1 else ''}")

    _guarded(run, report, step)


def probe_together(runs: list[HostRun], pool: ThreadPoolExecutor, timeout_s: float, report: Callable) -> None:
    """Run the probes' benchmarks in lockstep: each stage (CPU hosts: matmul, memory copy, decode, forward;
    probe.cpu_device) starts on every waiting host at one `go`, and the next waits for all of them. Hosts
    that share physical CPUs (an emulated cluster, VMs on one box) are then measured as a plan's phases load
    them: all start a task together and the faster ones finish first. Probed as each got ready, a slow host
    ran its last benchmarks beside whatever the others had reached, and its rate ratios scattered more
    (docs/profile.md). On separate machines the barriers only make every host wait for the slowest."""
    waiting = [r for r in runs if r.probe is not None]
    try:
        while waiting:
            list(pool.map(lambda r: probe_stage(r, timeout_s, report), waiting))
            waiting = [r for r in waiting if r.error is None and r.facts is None]
    finally:
        for run in runs:
            if run.probe is not None:
                run.probe.close()
                run.probe = None


# ---- links ------------------------------------------------------------------------------------------------


def region_class(a: HostEntry, b: HostEntry) -> tuple[str, str]:
    """Links are grouped by the (unordered) pair of regions their ends are in."""
    return tuple(sorted((a.region, b.region)))  # type: ignore[return-value]


def choose_pairs(entries: list[HostEntry]) -> list[tuple[HostEntry, HostEntry]]:
    """Pairs to measure: all of them up to 8 hosts; beyond, a spanning sample.

    The sample: inside each region a chain (h0–h1, h1–h2, ...), which spans the region; between every two
    regions one pair (their first hosts), which spans the cluster. Every region-pair class then has at
    least one measurement to infer the rest from.
    """
    if len(entries) <= FULL_MEASURE_PAIRS_UP_TO:
        return [(a, b) for i, a in enumerate(entries) for b in entries[i + 1 :]]
    by_region: dict[str, list[HostEntry]] = {}
    for entry in entries:
        by_region.setdefault(entry.region, []).append(entry)
    pairs = [(m[i], m[i + 1]) for m in by_region.values() for i in range(len(m) - 1)]
    regions = list(by_region)
    pairs += [(by_region[r][0], by_region[s][0]) for i, r in enumerate(regions) for s in regions[i + 1 :]]
    return pairs


def _is_loopback(entry: HostEntry) -> bool:
    if entry.is_local or entry.host == "localhost":
        return True
    try:
        import ipaddress

        return ipaddress.ip_address(entry.host).is_loopback
    except ValueError:
        return False


def link_kind(a: HostEntry, b: HostEntry) -> LinkKind:
    if _is_loopback(a) and _is_loopback(b):
        return "loopback"
    return "lan" if a.region == b.region else "wan"


def netbench_argv(python: str, *args: str) -> list[str]:
    return [python, "-m", "hetrl_cli.profiling.netbench", *args]


def measure_pair(a: HostRun, b: HostRun, quick: bool, timeout_s: float) -> dict[str, Any]:
    """Server on one host, client on the other. A local host is always the client: the remote end can be
    reached at its hosts.txt address, but we do not know which address the remote would reach us at."""
    server, client = (b, a) if a.entry.is_local and not b.entry.is_local else (a, b)
    assert server.executor is not None and client.executor is not None
    # An ssh config alias means nothing to the other host: it reaches the server at its HostName.
    address = "127.0.0.1" if server.entry.is_local else getattr(server.executor, "address", "") or server.entry.host
    token = secrets.token_hex(8)
    bind = "::" if ":" in address else "0.0.0.0"
    serve = netbench_argv(host_python(server.entry), "serve", "--token", token, "--bind", bind)
    handle = server.executor.start([*serve, "--lifetime", f"{timeout_s:g}", "--exit-on-eof"], timeout_s)
    try:
        line = handle.readline(timeout_s)
        try:
            port = int(json.loads(line)["port"])
        except (ValueError, KeyError, TypeError):
            raise HostFailure(
                f"netbench server on {server.entry.name} did not start: {handle.stderr_text().strip() or line!r}"
            ) from None
        bench = NETBENCH_QUICK if quick else NETBENCH_FULL
        client_args = ["client", "--host", address, "--port", str(port), "--token", token]
        client_args += ["--pings", str(bench["pings"]), "--max-bytes", str(bench["max_bytes"])]
        client_args += ["--max-seconds", str(bench["max_seconds"]), "--timeout", f"{timeout_s:g}"]
        done = client.executor.run(netbench_argv(host_python(client.entry), *client_args), timeout_s)
    except CommandTimeout:
        raise HostFailure(f"link measurement did not finish within {timeout_s:g}s") from None
    finally:
        handle.close()
    try:
        result = json.loads(done.stdout)
    except ValueError:
        result = {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output"}
    if done.rc != 0 or "error" in result:
        raise HostFailure(f"{client.entry.name} could not reach {address}:{port}: {result.get('error')}")
    return result


@dataclass
class LinkPhase:
    links: list[Link] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def measure_links(
    runs: list[HostRun], overrides: list[LinkOverride], quick: bool, timeout_s: float, report: Callable
) -> LinkPhase:
    """Measure the chosen pairs one at a time (so they don't contend), then infer the rest by class median."""
    phase = LinkPhase()
    by_name = {r.entry.name: r for r in runs}
    entries = [r.entry for r in runs]
    pairs = [(a, b) for a, b in choose_pairs(entries) if not fully_given(overrides, a, b)]
    started = time.monotonic()
    measured: dict[frozenset[str], Link] = {}
    for number, (a, b) in enumerate(pairs, start=1):
        if time.monotonic() - started > LINK_PHASE_BUDGET_S:
            phase.notes.append(f"link phase hit its {LINK_PHASE_BUDGET_S:g}s budget after {number - 1} pairs")
            break
        report("links", f"{a.name} <-> {b.name} ({number}/{len(pairs)})")
        try:
            result = measure_pair(by_name[a.name], by_name[b.name], quick, timeout_s)
        except HostFailure as exc:
            phase.failures[f"link {a.name} <-> {b.name}"] = str(exc)
            continue
        except Exception as exc:  # an SSH channel error mid-measurement still names the pair
            phase.failures[f"link {a.name} <-> {b.name}"] = f"{type(exc).__name__}: {exc}"
            continue
        measured[frozenset((a.name, b.name))] = Link(
            a=a.name,
            b=b.name,
            bandwidth_Bps=result["bandwidth_Bps"],
            latency_s=result["latency_s"],
            kind=link_kind(a, b),
            source="measured",
        )
    if pairs:
        report("links", f"{len(measured)} of {len(pairs)} measured", f"{time.monotonic() - started:.1f} s")
    phase.links = list(measured.values()) + infer_missing(entries, measured)
    bench = NETBENCH_QUICK if quick else NETBENCH_FULL
    if pairs:
        phase.notes.append(
            f"links: {len(measured)} of {len(pairs)} pairs measured one at a time in "
            f"{time.monotonic() - started:.1f}s: latency = median RTT/2 of {bench['pings']} 1-byte ping-pongs, "
            f"bandwidth = one TCP stream of up to {bench['max_bytes'] >> 20} MiB or {bench['max_seconds']:g}s"
        )
    if len(entries) > FULL_MEASURE_PAIRS_UP_TO:
        phase.notes.append(
            "links: sampled (more than 8 hosts): a chain inside each region plus one pair per region pair; "
            "the other pairs are 'inferred' from the median of their region-pair class"
        )
    return phase


def infer_missing(entries: list[HostEntry], measured: dict[frozenset[str], Link]) -> list[Link]:
    """Unmeasured pairs get the median bandwidth and latency of measured links in their region-pair class."""
    region = {e.name: e.region for e in entries}
    classes: dict[tuple[str, ...], list[Link]] = {}
    for link in measured.values():
        classes.setdefault(tuple(sorted((region[link.a], region[link.b]))), []).append(link)
    inferred = []
    for i, a in enumerate(entries):
        for b in entries[i + 1 :]:
            if frozenset((a.name, b.name)) in measured:
                continue
            samples = classes.get(region_class(a, b))
            if not samples:
                continue
            inferred.append(
                Link(
                    a=a.name,
                    b=b.name,
                    bandwidth_Bps=statistics.median(s.bandwidth_Bps for s in samples),
                    latency_s=statistics.median(s.latency_s for s in samples),
                    kind=link_kind(a, b),
                    source="inferred",
                )
            )
    return inferred


# ---- assembling the profile -------------------------------------------------------------------------------


def build_host(run: HostRun) -> tuple[Host, list[Device]]:
    entry, facts = run.entry, run.facts or {}
    host = Host(
        name=entry.name,
        address=entry.host,
        port=entry.port,
        user=entry.user,
        region=entry.region,
        python=host_python(entry),
        status="ok" if run.facts else "missing",
        error=run.error,
    )
    if not run.facts:
        return host, []
    intra = facts.get("intra_link")
    host = host.model_copy(
        update={
            "hostname": facts.get("hostname"),
            "software": facts.get("software", {}),
            "free_disk_bytes": facts.get("free_disk_bytes"),
            "cpu_count": facts.get("cpu_count"),
            "memory_bytes": facts.get("memory_bytes"),
            "intra_link": IntraLink.model_validate(intra) if intra else None,
        }
    )
    devices = [
        Device.model_validate({**d, "id": f"{entry.name}/{d['index']}", "host": entry.name, **device_price(entry, d)})
        for d in facts["devices"]
    ]
    return host, devices


def device_price(entry: HostEntry, device: dict[str, Any]) -> dict[str, Any]:
    """A probed device's price fields: hosts.txt's `price=` for its host, else the catalog's list price where
    the device's name is a catalog GPU with one (its source says so), else none (users add it)."""
    from hetrl_cli.profiling.catalog import catalog_price

    if entry.price is not None:
        return {"price_per_gpu_hour": entry.price, "price_source": f"hosts.txt {entry.source or entry.name} price="}
    found = catalog_price(str(device.get("name", ""))) if device.get("kind") == "cuda" else None
    if found is None:
        return {}
    return {"price_per_gpu_hour": found[0], "price_source": found[1]}


class _Progress:
    """What the run is doing, on stderr. On a terminal: a live line per host (transient). Elsewhere (CI logs,
    pipes): one plain, never wrapped line per host that finishes its probe and per link step, so a log shows
    progress during the ~30 s a profile takes: `profile: gpu-0 done (8 devices, 12.3 s)`. Failures are not
    announced there: the error or warning that ends the run lists each one once. Once a host has failed
    without --allow-partial no profile will be written, so the lines stop and that error follows."""

    def __init__(self, names: Iterable[str], allow_partial: bool) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.enabled = self.console.is_terminal
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=self.console, transient=True
        )
        self.tasks: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._names = list(names)
        self._started = time.monotonic()
        self._allow_partial = allow_partial
        self._doomed = False

    def __enter__(self) -> _Progress:
        self._started = time.monotonic()
        if self.enabled:
            self.progress.start()
            for name in self._names:
                self.tasks[name] = self.progress.add_task(f"{name}: waiting", total=None)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.progress.stop()

    def report(self, name: str, status: str, detail: str = "") -> None:
        """`name` (a host, or `links`) reached `status`; `detail` says more (`8 devices`)."""
        if self.enabled:
            with self._lock:
                if name not in self.tasks:
                    self.tasks[name] = self.progress.add_task(name, total=None)
                text = f"{name}: {status}" + (f" ({detail})" if detail else "")
                self.progress.update(self.tasks[name], description=text)
            return
        if status == "failed":
            self._doomed = not self._allow_partial
        elif self._doomed:
            return
        elif status == "done":
            elapsed = f"{time.monotonic() - self._started:.1f} s"
            self.line(f"profile: {name} done ({detail + ', ' if detail else ''}{elapsed})")
        elif name == "links":
            self.line(f"profile: links: {status}" + (f" ({detail})" if detail else ""))

    def line(self, text: str) -> None:
        """One message: through rich on a terminal (around the live lines), else written whole, unwrapped."""
        with self._lock:
            if self.enabled:
                self.console.print(text, markup=False, highlight=False)
            else:
                sys.stderr.write(text + "\n")
                sys.stderr.flush()


def _default_name(hosts_file: Path | str) -> str:
    return "stdin" if str(hosts_file) == "-" else Path(hosts_file).stem


def profile_hosts(hosts_file: Path | str, options: ProfileOptions) -> ClusterProfile:
    """Profile every host of `hosts_file`; RemoteError naming each failed host unless --allow-partial."""
    # 1) inputs
    entries = load_hosts(hosts_file)
    overrides = load_link_overrides(options.links_file, entries) if options.links_file else []
    quick = options.quick if options.quick is not None else os.environ.get(QUICK_ENV, "") not in ("", "0")
    known = KnownHosts(options.known_hosts or Path.home() / ".ssh" / "known_hosts", options.accept_new_host_keys)
    ssh = SshSettings(known, SshConfig.load(options.ssh_config, options.use_ssh_config))
    for entry in entries:  # a bad ssh config is one line before any connection
        if not entry.is_local:
            ssh.config.resolve(entry)
    started = time.monotonic()
    with _Progress((e.name for e in entries), options.allow_partial) as progress:
        # 2) connect and start the probe on all hosts in parallel, then benchmark them all together
        with ThreadPoolExecutor(max_workers=min(32, len(entries))) as pool:
            runs = list(pool.map(lambda e: prepare_one(e, ssh, quick, options.timeout_s, progress.report), entries))
            probe_together(runs, pool, options.timeout_s, progress.report)
        try:
            for line in known.added:
                progress.line(line)
            ok = [r for r in runs if r.facts is not None]
            failures = {r.entry.name: r.error or "unknown error" for r in runs if r.facts is None}
            _check_failures(failures, len(runs), options, any_ok=bool(ok))
            # 3) links, one pair at a time
            phase = measure_links(ok, overrides, quick, options.timeout_s, progress.report)
            _check_link_failures(phase.failures, options)
        finally:
            for run in runs:
                if run.executor is not None:
                    run.executor.close()
    for what, reason in {**failures, **phase.failures}.items():
        progress.line(f"warning: {what}: {reason}")
    # 4) overrides, 5) the profile
    links, override_notes = apply_overrides(phase.links, overrides, [r.entry for r in ok], link_kind)
    hosts_devices = [build_host(r) for r in runs]
    notes = [
        f"probed {len(ok)} of {len(runs)} hosts in lockstep (each benchmark started on all at once) in "
        f"{time.monotonic() - started:.1f}s total" + (" (quick microbenchmarks)" if quick else ""),
        *phase.notes,
        *override_notes,
        *known.added,
    ]
    profile = ClusterProfile(
        name=options.name or _default_name(hosts_file),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        method="ssh-probe",
        notes=notes,
        hosts=[h for h, _ in hosts_devices],
        devices=[d for _, devs in hosts_devices for d in devs],
        links=links,
    )
    return profile.with_fingerprint()


def _check_failures(failures: dict[str, str], total: int, options: ProfileOptions, any_ok: bool) -> None:
    if not failures:
        return
    lines = "\n".join(f"  {name}: {reason}" for name, reason in failures.items())
    if not any_ok:
        which = "the host" if total == 1 else f"any of the {total} hosts"
        raise RemoteError(f"could not profile {which}; no profile written:\n{lines}")
    if not options.allow_partial:
        raise RemoteError(
            f"could not profile {len(failures)} of {total} hosts; no profile written "
            f"(--allow-partial writes the others and marks these missing):\n{lines}"
        )


def _check_link_failures(failures: dict[str, str], options: ProfileOptions) -> None:
    if failures and not options.allow_partial:
        lines = "\n".join(f"  {what}: {reason}" for what, reason in failures.items())
        raise RemoteError(
            f"could not measure {len(failures)} link(s); no profile written (give them in --links, or "
            f"--allow-partial infers them from similar links):\n{lines}"
        )
