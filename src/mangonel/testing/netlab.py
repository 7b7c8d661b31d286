"""``NetLab``: hosts of their own on one Linux machine, joined by a switch a test can cut.

>>> with NetLab(tmp) as lab:                                           # doctest: +SKIP
...     a, b = lab.add_host("a"), lab.add_host("b")
...     server = lab.start(b, ["python", "-m", "http.server", "--bind", b.address])
...     lab.cut(b)          # b's switch port stops forwarding: packets vanish
...     lab.heal(b)

**A host** is what a process on another machine would see as one:

* its own network namespace, with one interface ``eth0`` and one address on a
  private /24 (``10.77.X.0/24``, X chosen per run) and a loopback;
* its own host name (a UTS namespace), the host's ``name``: an executor reports
  it as its host identity, so two executors never take each other for local;
* its own disk: a directory ``root/hosts/<name>/`` that its processes see at
  ``MOUNT_POINT`` (``/srv/mangonel``) and nowhere else. Each process gets a mount
  namespace in which ``/srv`` is an empty tmpfs with the host's directory bound
  at ``/srv/mangonel``, and an empty tmpfs hides ``root/hosts`` itself, so no
  host sees another's files by any path. A process started again on the same
  host sees the same directory. ``TMPDIR`` points into it too. The rest of the
  file system (the Python installation, the tables' Parquet files, ``root/logs``)
  is shared, as read-only software and data would be.

**The network.** The bridge lives in a namespace of its own (the *switch*), and
each host's ``eth0`` is one end of a veth pair whose other end is a port of that
bridge. The machine's own namespace has no interface, no address and no route on
the test subnet: no packet of a test can leave the machine or reach a service
outside the lab.

**Processes** start with ``start(host, argv)``: ``ip netns exec`` enters the
host's network namespace, ``unshare --uts --mount`` makes the host name and mount
namespace, a shell sets them up, and ``setpriv --pdeathsig TERM`` then ``exec``s
the program. Every step ``exec``s the next, so the handle's pid is the program's
own, and the program gets SIGTERM when the process that started it dies, even by
SIGKILL: a killed test run leaves nothing running. (A per-host holder process
that each start enters with ``nsenter`` would share one mount namespace per host;
a fresh one per process is simpler, needs no holder to keep alive and clean up,
and gives the same view, since every process of a host binds the same
directory.) ``mangonel`` processes are also given ``DIE_WITH_PARENT_ENV``, as a
``LocalCluster``'s are. Any program can be started this way, such as an object
store's server.

**Faults**, each undone by ``heal``:

* ``cut(host)``: the host's switch port stops forwarding (bridge port state
  *disabled*). Its own link stays up; packets to and from it vanish: no reset,
  no error, only silence, as when a cable between two switches is cut.
* ``link_down(host)``: the host's own ``eth0`` goes down: its sockets fail at
  once (no route), while its peers hear silence.
* ``cut_between(a, b)``: packets from ``a`` to ``b`` vanish (``both=True``: and
  back). A ``tc`` u32 filter on ``a``'s switch port matches the destination
  address and redirects the packet to a switch device that is down, which drops
  it (this kernel has no ``gact``, so no ``action drop``; ``mirred`` to a down
  device is its equivalent). ARP still passes: the peers stay known, as on a
  real network whose filter drops only IP.
* ``slow(host, rate)``: both directions of the host's link limited to ``rate``
  (``tc`` rates: ``"1mbit"``): a token bucket (``tbf``) on its ``eth0`` for what it
  sends, and the switch port's ``htb`` classes for what it receives.

**Counters.** Each switch port has an ``htb`` class per other host, so
``traffic(src, dst)`` gives the bytes the switch delivered from ``src`` to
``dst``: a test can prove that data crossed the network between two hosts.

Names: namespaces are ``mnl<pid>x<n>-<host>`` and ``mnl<pid>x<n>-switch`` (the
pid of the process that made the lab). ``close`` (also at exit) stops every
process and deletes every namespace, which takes the veths and the bridge with
them. A new lab first deletes the namespaces of labs whose process is gone (a
killed run), with any process left in them.

Needs root, ``ip``, ``bridge`` and ``tc`` (iproute2), ``unshare``, ``setpriv``
and ``mount`` (util-linux); ``NetLab.unavailable()`` says what is missing.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from mangonel.client.cluster import ProcessHandle, child_env
from mangonel.errors import ClusterError
from mangonel.options import TEST_HOOKS_ENV

MOUNT_POINT = "/srv/mangonel"
"""Where a host's processes see the host's own directory."""

_NS_RE = re.compile(r"^mnl(\d+)x(\d+)-")
_SWITCH = "switch"
_BRIDGE = "br0"
_SINK = "sink"
"""A switch device left down: packets redirected to it are dropped."""
_LINE_RATE = "10gbit"
"""The htb rate of an unslowed port: far above what a veth carries on this machine."""
_HTB_SIZES = ("burst", "256k", "cburst", "256k", "quantum", "60000")
"""Set, not derived: at 10gbit htb derives a burst of 0 bytes."""
_TOOLS = ("ip", "bridge", "tc", "unshare", "setpriv", "mount")
_CMD_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 5.0

# The shell run in a new UTS and mount namespace before the program: $1 host
# name, $2 the host's directory, $3 the directory of every host's directory
# (hidden), $4 the mount point; then the program and its arguments.
_ENTER_HOST = (
    'hostname "$1"'
    ' && mount -t tmpfs -o size=1m,mode=0755 mangonel-host "${4%/*}"'
    ' && mkdir "$4" && mount --bind "$2" "$4"'
    ' && mount -t tmpfs -o size=1m,mode=0755 mangonel-hidden "$3"'
    ' && cd "$4" && shift 4 && exec "$@"'
)

_labs: weakref.WeakSet[NetLab] = weakref.WeakSet()
_sequence = itertools.count()


@dataclass(frozen=True)
class Host:
    """One host of a lab.

    Attributes:
        name: Its host name (and the name of its directory and log files).
        index: Its number in the lab, from 1.
        address: Its IPv4 address on the lab's network.
        netns: Its network namespace.
        port: Its port on the switch (the switch's end of its veth pair).
        dir: Its own directory, as the test sees it; its processes see it at
            ``MOUNT_POINT``.
    """

    name: str
    index: int
    address: str
    netns: str
    port: str
    dir: Path

    def outside(self, inside: str) -> Path:
        """The path the test sees for ``inside``, a path under ``MOUNT_POINT`` on this host."""
        relative = os.path.relpath(inside, MOUNT_POINT)
        if relative.startswith(".."):
            raise ValueError(f"{inside} is not under {MOUNT_POINT}")
        return self.dir / relative


class NetLab:
    """Hosts in network, UTS and mount namespaces, joined by a bridge.

    Args:
        root: Where the hosts' directories (``hosts/<name>``) and the process
            logs (``logs/<name>.log``) go; kept after ``close``.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        problem = self.unavailable()
        if problem:
            raise ClusterError(f"cannot build a network lab: {problem}")
        self.root = Path(root).resolve()
        self.hosts_root = self.root / "hosts"
        self.log_dir = self.root / "logs"
        seq = next(_sequence)
        self.prefix = f"mnl{os.getpid()}x{seq}"
        self.subnet = f"10.77.{(os.getpid() + seq) % 250 + 1}"
        self.switch = f"{self.prefix}-{_SWITCH}"
        self.hosts: dict[str, Host] = {}
        self.processes: list[ProcessHandle] = []
        self._lock = threading.Lock()
        self._closed = False
        self._cuts: set[tuple[str, str]] = set()
        self._rates: dict[str, str] = {}
        """Host name -> the rate ``slow`` set; absent: line rate."""

    @staticmethod
    def unavailable() -> str | None:
        """Why a lab cannot be built here (not root, a tool missing), or ``None``."""
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            return "network namespaces need root"
        missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
        if missing:
            return f"missing {', '.join(missing)} (iproute2, util-linux)"
        if not os.path.isdir(os.path.dirname(MOUNT_POINT)):
            return f"{os.path.dirname(MOUNT_POINT)} does not exist (a mount point for host dirs)"
        return None

    # ------------------------------------------------------------------ life cycle

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def open(self) -> Self:
        """Delete what killed runs left, then make the switch."""
        remove_stale_namespaces()
        self.hosts_root.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        _labs.add(self)
        try:
            _run("ip", "netns", "add", self.switch)
            self._sw("ip", "link", "set", "lo", "up")
            self._sw("ip", "link", "add", _BRIDGE, "type", "bridge")
            self._sw("ip", "link", "set", _BRIDGE, "up")
            self._sw("ip", "link", "add", _SINK, "type", "ifb")  # left down
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL), then delete every namespace."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for proc in self.processes:
            proc.signal(signal.SIGTERM)
            proc.signal(signal.SIGCONT)
        for proc in self.processes:
            proc.stop(_STOP_TIMEOUT_S)
        for host in self.hosts.values():
            _delete_namespace(host.netns)
        _delete_namespace(self.switch)
        _labs.discard(self)

    # ----------------------------------------------------------------------- hosts

    def add_host(self, name: str) -> Host:
        """A new host named ``name`` (also its host name), on the switch, with a fresh address."""
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}", name):
            raise ValueError(f"a host name is lower-case letters, digits and '-': {name!r}")
        if name in self.hosts:
            raise ValueError(f"host {name} exists")
        index = len(self.hosts) + 1
        if index > 200:
            raise ValueError("a lab has at most 200 hosts")
        host = Host(
            name=name,
            index=index,
            address=f"{self.subnet}.{index + 10}",
            netns=f"{self.prefix}-{name}",
            port=f"p{index}-{name}"[:15],
            dir=self.hosts_root / name,
        )
        (host.dir / "tmp").mkdir(parents=True, exist_ok=True)
        _run("ip", "netns", "add", host.netns)
        self.hosts[name] = host
        self._in(host, "ip", "link", "set", "lo", "up")
        self._sw("ip", "link", "add", host.port, "type", "veth", "peer", "name", "eth0",
                 "netns", host.netns)  # fmt: skip
        self._sw("ip", "link", "set", host.port, "master", _BRIDGE)
        self._sw("ip", "link", "set", host.port, "up")
        self._in(host, "ip", "addr", "add", f"{host.address}/24", "dev", "eth0")
        self._in(host, "ip", "link", "set", "eth0", "up")
        # What the switch delivers to this host, one htb class per sender (the
        # counters of ``traffic``, the rate of ``slow``); cut filters hook clsact.
        self._sw("tc", "qdisc", "add", "dev", host.port, "root", "handle", "1:", "htb",
                 "default", "1")  # fmt: skip
        self._sw("tc", "qdisc", "add", "dev", host.port, "clsact")
        self._add_class(host, 1, _LINE_RATE)
        for other in self.hosts.values():
            if other is not host:
                self._count(other, host)
                self._count(host, other)
        return host

    def host(self, name: str) -> Host:
        return self.hosts[name]

    # ------------------------------------------------------------------- processes

    def command(self, host: Host, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` on ``host`` (see the module docstring)."""
        return [
            "ip", "netns", "exec", host.netns,
            "unshare", "--uts", "--mount", "--propagation", "private",
            "sh", "-c", _ENTER_HOST, "mangonel-host",
            host.name, str(host.dir), str(self.hosts_root), MOUNT_POINT,
            "setpriv", "--pdeathsig", "TERM", "--", *argv,
        ]  # fmt: skip

    def host_env(self, host: Host, env: Mapping[str, str] | None = None) -> dict[str, str]:
        merged = child_env()
        merged["TMPDIR"] = f"{MOUNT_POINT}/tmp"
        merged[TEST_HOOKS_ENV] = "1"  # the test-only options (--faults-file) are taken
        if merged.get("PYTHONPATH"):  # processes start in MOUNT_POINT: no relative entries
            merged["PYTHONPATH"] = os.pathsep.join(
                os.path.abspath(p) for p in merged["PYTHONPATH"].split(os.pathsep) if p
            )
        merged.update(env or {})
        return merged

    def start(
        self,
        host: Host,
        argv: Sequence[str],
        name: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProcessHandle:
        """Start ``argv`` on ``host``; its output goes to ``logs/<name>.log``.

        The process is stopped by ``close`` (or by the handle's ``stop``), and
        gets SIGTERM if this process dies first.
        """
        if self._closed:
            raise ClusterError("the lab is closed")
        name = name or host.name
        proc = ProcessHandle(
            name,
            self.command(host, argv),
            self.log_dir / f"{name}.log",
            self.host_env(host, env),
        )
        with self._lock:
            self.processes.append(proc)
        return proc

    def run(
        self, host: Host, argv: Sequence[str], timeout: float = _CMD_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``host`` to its end; its output is captured."""
        return subprocess.run(
            self.command(host, argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.host_env(host),
            check=False,
        )

    # ---------------------------------------------------------------------- faults

    def cut(self, host: Host) -> None:
        """Silence: the host's switch port forwards nothing, either way."""
        self._sw("bridge", "link", "set", "dev", host.port, "state", "0")  # disabled

    def link_down(self, host: Host) -> None:
        """The host's own link goes down: its sockets fail at once."""
        self._in(host, "ip", "link", "set", "eth0", "down")

    def cut_between(self, a: Host, b: Host, both: bool = True) -> None:
        """Packets from ``a`` to ``b`` vanish (and from ``b`` to ``a`` with ``both``)."""
        pairs = [(a, b), (b, a)] if both else [(a, b)]
        for src, dst in pairs:
            if (src.name, dst.name) in self._cuts:
                continue
            self._sw("tc", "filter", "add", "dev", src.port, "ingress", "protocol", "ip",
                     "pref", str(100 + dst.index), "u32", "match", "ip", "dst",
                     f"{dst.address}/32", "action", "mirred", "egress", "redirect",
                     "dev", _SINK)  # fmt: skip
            self._cuts.add((src.name, dst.name))

    def slow(self, host: Host, rate: str) -> None:
        """Limit what ``host`` sends and receives to ``rate`` each (a ``tc`` rate: ``"2mbit"``)."""
        self._in(host, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate,
                 "burst", "32kb", "latency", "200ms")  # fmt: skip
        self._set_rate(host, rate)

    def heal(self, *hosts: Host) -> None:
        """Undo every fault of ``hosts`` (of every host when none is given)."""
        chosen = list(hosts) or list(self.hosts.values())
        names = {h.name for h in chosen}
        for host in chosen:
            # The link first: a port without carrier takes no state.
            self._in(host, "ip", "link", "set", "eth0", "up")
            self._sw("bridge", "link", "set", "dev", host.port, "state", "3")  # forwarding
            if host.name in self._rates:
                self._in(host, "tc", "qdisc", "del", "dev", "eth0", "root")
                self._set_rate(host, _LINE_RATE)
                del self._rates[host.name]
        for src, dst in sorted(self._cuts):
            if src in names or dst in names:
                self.heal_between(self.hosts[src], self.hosts[dst], both=False)

    def heal_between(self, a: Host, b: Host, both: bool = True) -> None:
        """Undo ``cut_between(a, b, both)``."""
        pairs = [(a, b), (b, a)] if both else [(a, b)]
        for src, dst in pairs:
            if (src.name, dst.name) in self._cuts:
                self._sw("tc", "filter", "del", "dev", src.port, "ingress", "pref",
                         str(100 + dst.index))  # fmt: skip
                self._cuts.discard((src.name, dst.name))

    # -------------------------------------------------------------------- counters

    def traffic(self, src: Host, dst: Host) -> int:
        """Bytes the switch has delivered from ``src`` to ``dst`` (IP and ARP alike)."""
        # No JSON for classes in this iproute2: "class htb 1:N ...\n Sent B bytes ...".
        out = self._sw("tc", "-s", "class", "show", "dev", dst.port)
        match = re.search(rf"^class htb 1:{100 + src.index} .*\n\s*Sent (\d+) bytes", out, re.M)
        if match:
            return int(match.group(1))
        raise ClusterError(f"no counter of {src.name} -> {dst.name} on port {dst.port}")

    # ------------------------------------------------------------------- plumbing

    def _add_class(self, host: Host, minor: int, rate: str) -> None:
        self._sw("tc", "class", "add", "dev", host.port, "parent", "1:", "classid",
                 f"1:{minor}", "htb", "rate", rate, *_HTB_SIZES)  # fmt: skip

    def _count(self, src: Host, dst: Host) -> None:
        """A class on ``dst``'s port for what ``src`` sends it."""
        minor = 100 + src.index
        self._add_class(dst, minor, self._rate_of(dst))
        self._sw("tc", "filter", "add", "dev", dst.port, "parent", "1:", "protocol", "ip",
                 "pref", "1", "u32", "match", "ip", "src", f"{src.address}/32",
                 "flowid", f"1:{minor}")  # fmt: skip

    def _rate_of(self, host: Host) -> str:
        return self._rates.get(host.name, _LINE_RATE)

    def _set_rate(self, host: Host, rate: str) -> None:
        self._rates[host.name] = rate
        minors = [1] + [100 + o.index for o in self.hosts.values() if o is not host]
        for minor in minors:
            self._sw("tc", "class", "change", "dev", host.port, "parent", "1:", "classid",
                     f"1:{minor}", "htb", "rate", rate, *_HTB_SIZES)  # fmt: skip

    def _sw(self, *argv: str) -> str:
        return _run("ip", "netns", "exec", self.switch, *argv)

    def _in(self, host: Host, *argv: str) -> str:
        return _run("ip", "netns", "exec", host.netns, *argv)


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _namespaces() -> list[str]:
    out = _run("ip", "netns", "list")
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _delete_namespace(name: str) -> None:
    """Kill what still runs in namespace ``name`` (only this harness's processes
    live there), then delete it; a namespace already gone is fine."""
    with contextlib.suppress(ClusterError, subprocess.TimeoutExpired):
        for pid in _run("ip", "netns", "pids", name).split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
    with contextlib.suppress(ClusterError, subprocess.TimeoutExpired):
        _run("ip", "netns", "del", name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_namespaces() -> list[str]:
    """Delete the namespaces of labs whose process is gone; return their names."""
    stale = []
    for name in _namespaces():
        match = _NS_RE.match(name)
        if match and not _alive(int(match.group(1))):
            _delete_namespace(name)
            stale.append(name)
    return stale


@atexit.register
def _close_all() -> None:
    for lab in list(_labs):
        lab.close()
