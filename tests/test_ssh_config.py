"""~/.ssh/config for hetrl's SSH connections (remote/sshconfig.py): aliases, User, Port, IdentityFile, ProxyJump.

The resolution rules run on their own; the connections run for real against an sshd of our own on 127.0.0.2/.3/.4
whose addresses may forward only along one path (.2 -> .3 -> .4): a ProxyJump that works through .3 and is refused
through .2 shows that the connection really goes through the jump host hetrl was told to use. Bad configs are one
line and exit 2 before any connection; a config that would run a command is refused without running it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hetrl_cli.artifacts.hosts import parse_host_line
from hetrl_cli.artifacts.io import load_artifact
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.errors import BadInput
from hetrl_cli.remote.sshconfig import SshConfig
from sshd import SshdHosts, skip_reason, start_sshd

Hetrl = Callable[..., "subprocess.CompletedProcess[str]"]

FORWARD_ONLY_ALONG_A_PATH = (
    "Match LocalAddress 127.0.0.2",
    "    PermitOpen 127.0.0.3:*",
    "Match LocalAddress 127.0.0.3",
    "    PermitOpen 127.0.0.4:*",
    "Match LocalAddress 127.0.0.4",
    "    AllowTcpForwarding no",
)


def entry(line: str):
    parsed = parse_host_line(line, "hosts.txt:1")
    assert parsed is not None
    return parsed


def one_line_exit_2(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# ---- resolution ---------------------------------------------------------------------------------------------


def test_alias_gives_hostname_user_port_and_identity_file(tmp_path: Path) -> None:
    key = tmp_path / "id_lab"
    key.write_text("not read here")
    config = SshConfig.from_text(
        f"Host gpu1\n  HostName 10.0.0.7\n  User ada\n  Port 2222\n  IdentityFile {key}\n  IdentitiesOnly yes\n", "cfg"
    )
    target = config.resolve(entry("gpu1"))
    assert (target.hostname, target.user, target.port) == ("10.0.0.7", "ada", 2222)
    assert target.identities == (str(key),) and target.identities_only and target.jump is None
    assert target.known_hosts_name == "[10.0.0.7]:2222" and target.where == "gpu1 (10.0.0.7:2222)"


def test_hosts_txt_user_port_and_identity_win_over_the_config(tmp_path: Path) -> None:
    config = SshConfig.from_text("Host gpu1\n  HostName 10.0.0.7\n  User ada\n  Port 2222\n  IdentityFile /x\n", "c")
    target = config.resolve(entry("bob@gpu1:2200 identity=/keys/bob"))
    assert (target.hostname, target.user, target.port) == ("10.0.0.7", "bob", 2200)
    assert target.identities == ("/keys/bob",) and target.identities_only
    assert target.identity_from == "identity= in hosts.txt:1"


def test_no_config_resolves_every_host_to_itself() -> None:
    target = SshConfig.none().resolve(entry("gpu1:2222"))
    assert (target.hostname, target.port, target.jump, target.identities) == ("gpu1", 2222, None, ())


def test_proxyjump_hops_in_order_and_the_first_hops_own_jump_applies() -> None:
    config = SshConfig.from_text(
        "Host inner\n  HostName 10.1.0.5\n  ProxyJump ssh://eve@mid:2201,last\n"
        "Host mid\n  HostName 192.0.2.1\n  ProxyJump edge\n"
        "Host last\n  HostName 10.1.0.1\n  ProxyJump ignored-for-a-later-hop\n"
        "Host edge\n  HostName 198.51.100.9\n  User gate\n",
        "cfg",
    )
    chain = config.resolve(entry("inner")).chain()
    assert [(h.name, h.hostname) for h in chain] == [
        ("edge", "198.51.100.9"),
        ("mid", "192.0.2.1"),
        ("last", "10.1.0.1"),
        ("inner", "10.1.0.5"),
    ]
    assert (chain[0].user, chain[1].user, chain[1].port) == ("gate", "eve", 2201)


def test_a_wildcard_block_does_not_make_the_jump_host_jump_through_itself() -> None:
    config = SshConfig.from_text("Host *.lab\n  ProxyJump gw.lab\n", "cfg")
    chain = config.resolve(entry("n1.lab")).chain()
    assert [h.name for h in chain] == ["gw.lab", "n1.lab"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Host a\n  ProxyJump b\nHost b\n  ProxyJump a\n", "longer than 8 hops"),
        ("Host a\n  ProxyCommand nc %h %p\n", "ProxyCommand applies to a, and hetrl does not run commands"),
        ("Host a\n  Port 99999\n", "Port '99999' for a: expected a number from 1 to 65535"),
        ("Host a\n  HostName bad;name\n", "HostName for a: bad host 'bad;name'"),
        ("Host a\n  User 'x y'\n", "User"),
        ("Host a\n  ProxyJump bad;hop\n", "ProxyJump of a: bad host 'bad;hop'"),
    ],
)
def test_bad_config_values_are_one_line_naming_the_file(text: str, message: str) -> None:
    with pytest.raises(BadInput, match="ssh config cfg") as caught:
        SshConfig.from_text(text, "cfg").resolve(entry("a"))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_match_exec_is_refused_and_never_run(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    config = SshConfig.from_text(f'Match host a exec "touch {ran}"\n  User x\n', "cfg")
    assert config.resolve(entry("b")).user != "x"  # the block cannot apply to b: nothing to refuse
    with pytest.raises(BadInput, match=r"Match exec touch .* applies to a, and hetrl does not run commands"):
        config.resolve(entry("a"))
    assert not ran.exists()


def test_include_is_followed_and_the_block_around_it_continues(tmp_path: Path) -> None:
    (tmp_path / "lab.conf").write_text("Host gpu*\n  User ada\n")
    main = tmp_path / "config"
    main.write_text(f"Host gpu1\n  Include {tmp_path}/*.conf\n  HostName 10.0.0.7\n")
    target = SshConfig.load(main).resolve(entry("gpu1"))
    assert (target.hostname, target.user) == ("10.0.0.7", "ada")


def test_default_is_home_ssh_config_and_a_missing_one_reads_as_none(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert SshConfig.load().resolve(entry("gpu1")).hostname == "gpu1"
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host gpu1\n  HostName 10.0.0.7\n")
    assert SshConfig.load().resolve(entry("gpu1")).hostname == "10.0.0.7"
    assert SshConfig.load(enabled=False).resolve(entry("gpu1")).hostname == "gpu1"


# ---- the CLI: bad configs are one line before any connection -------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("Host *\n  ProxyCommand ssh -W %h:%p gw\n", "ProxyCommand applies to 192.0.2.1"),
        ('Match exec "touch {tmp}/ran"\n', "Match exec touch"),
        (None, "cannot read ssh config"),
        (b"Host \xff\n", "is not UTF-8 text"),
        ("Host a b c\n  ProxyJump\n", "ssh config"),
    ],
)
def test_profile_refuses_a_bad_ssh_config_in_one_line(
    hetrl: Hetrl, tmp_path: Path, config: str | bytes | None, message: str
) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("192.0.2.1\n")  # TEST-NET: never reached, the config is refused first
    path = tmp_path / "ssh_config"
    if isinstance(config, bytes):
        path.write_bytes(config)
    elif config is not None:
        path.write_text(config.format(tmp=tmp_path))
    line = one_line_exit_2(hetrl("profile", hosts, "--ssh-config", path, "--timeout", "5", "-o", tmp_path / "p.json"))
    assert message in line
    assert not (tmp_path / "ran").exists() and not (tmp_path / "p.json").exists()


def test_ssh_config_and_no_ssh_config_together_are_refused(hetrl: Hetrl, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("192.0.2.1\n")
    line = one_line_exit_2(hetrl("profile", hosts, "--ssh-config", tmp_path / "c", "--no-ssh-config"))
    assert "either --ssh-config PATH or --no-ssh-config" in line


# ---- real connections -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def path_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdHosts]:
    """sshd on .2/.3/.4 where .2 may forward only to .3, .3 only to .4, and .4 not at all."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with start_sshd(tmp_path_factory.mktemp("path-sshd"), extra=FORWARD_ONLY_ALONG_A_PATH) as hosts:
        yield hosts


def lab_config(hosts: SshdHosts, inner_jump: str | None) -> str:
    """Aliases for the three addresses; `inner` (127.0.0.4) through `inner_jump` when given."""
    jump = f"  ProxyJump {inner_jump}\n" if inner_jump else ""
    return (
        f"Host edge\n  HostName 127.0.0.2\nHost gw\n  HostName 127.0.0.3\nHost inner\n  HostName 127.0.0.4\n{jump}"
        f"Host *\n  User {hosts.user}\n  Port {hosts.port}\n  IdentityFile {hosts.identity}\n  IdentitiesOnly yes\n"
    )


def profile_alias(hetrl: Hetrl, hosts: SshdHosts, tmp_path: Path, config: str | None):
    """Profile the alias `inner` with `config` as --ssh-config, or with --no-ssh-config when None."""
    (tmp_path / "hosts.txt").write_text(f"inner python={hosts.python}\n")
    (tmp_path / "ssh_config").write_text(config or "")
    args = ["profile", tmp_path / "hosts.txt", "--known-hosts", hosts.known_hosts, "--timeout", "60"]
    ssh = ["--ssh-config", tmp_path / "ssh_config"] if config is not None else ["--no-ssh-config"]
    return hetrl(*args, *ssh, "-o", tmp_path / "p.json")


def test_an_alias_from_the_ssh_config_is_profiled(hetrl: Hetrl, path_sshd: SshdHosts, tmp_path: Path) -> None:
    """No user, port or key in hosts.txt: all from the config. Without it the alias does not resolve."""
    result = profile_alias(hetrl, path_sshd, tmp_path, lab_config(path_sshd, None))
    assert result.returncode == 0, result.stderr
    profile = load_artifact(tmp_path / "p.json", ClusterProfile)
    assert [h.name for h in profile.hosts] == ["inner"] and profile.hosts[0].status == "ok"
    refused = profile_alias(hetrl, path_sshd, tmp_path, None)
    assert refused.returncode == 1
    assert "inner: cannot resolve host name 'inner'" in refused.stderr


def test_the_default_ssh_config_is_home_ssh_config(hetrl: Hetrl, path_sshd: SshdHosts, tmp_path: Path) -> None:
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(lab_config(path_sshd, None))
    (tmp_path / "hosts.txt").write_text(f"inner python={path_sshd.python}\n")
    result = hetrl(
        "profile", tmp_path / "hosts.txt", "--known-hosts", path_sshd.known_hosts, "--json", HOME=str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    assert '"name": "inner"' in result.stdout


def test_proxyjump_goes_through_the_jump_host(hetrl: Hetrl, path_sshd: SshdHosts, tmp_path: Path) -> None:
    """.3 may forward to .4, .2 may not: through gw it works, through edge the jump host refuses (the message
    names it), so the connection is made by the jump host, not directly."""
    through_gw = profile_alias(hetrl, path_sshd, tmp_path, lab_config(path_sshd, "gw"))
    assert through_gw.returncode == 0, through_gw.stderr
    assert "profile: inner done (1 device," in through_gw.stderr
    through_edge = profile_alias(hetrl, path_sshd, tmp_path, lab_config(path_sshd, "edge"))
    assert through_edge.returncode == 1
    assert "inner: jump host edge (127.0.0.2:" in through_edge.stderr
    assert f"could not open a connection to 127.0.0.4:{path_sshd.port}" in through_edge.stderr
    assert "prohibited" in through_edge.stderr


def test_two_hops_in_order(hetrl: Hetrl, path_sshd: SshdHosts, tmp_path: Path) -> None:
    """edge may reach only gw, gw only inner: `edge,gw` works, `gw,edge` cannot."""
    assert profile_alias(hetrl, path_sshd, tmp_path, lab_config(path_sshd, "edge,gw")).returncode == 0
    wrong = profile_alias(hetrl, path_sshd, tmp_path, lab_config(path_sshd, "gw,edge"))
    assert wrong.returncode == 1 and "jump host gw (127.0.0.3:" in wrong.stderr


def test_jump_host_keys_are_checked_strictly(hetrl: Hetrl, path_sshd: SshdHosts, tmp_path: Path) -> None:
    """A jump host missing from known_hosts is refused like the target, and named as the jump host."""
    known = tmp_path / "known_hosts"
    known.write_text(path_sshd.known_hosts_line("127.0.0.4"))  # the target only
    (tmp_path / "hosts.txt").write_text(f"inner python={path_sshd.python}\n")
    (tmp_path / "ssh_config").write_text(lab_config(path_sshd, "gw"))
    result = hetrl("profile", tmp_path / "hosts.txt", "--known-hosts", known, "--ssh-config", tmp_path / "ssh_config")
    assert result.returncode == 1
    assert f"inner: jump host gw (127.0.0.3:{path_sshd.port}): host key ssh-ed25519" in result.stderr
    assert f"of [127.0.0.3]:{path_sshd.port} is not in {known}" in result.stderr
    assert known.read_text() == path_sshd.known_hosts_line("127.0.0.4")


# ---- hetrl run: preflight and launch through the config --------------------------------------------------------


def run_through_config(path_sshd: SshdHosts, tmp_path: Path, python_b: str, *extra: str) -> subprocess.CompletedProcess:
    """A two-host plan on aliases: lab-a is 127.0.0.2, lab-b is 127.0.0.4 behind the jump host gw (.3)."""
    from conftest import HETRL, hetrl_env
    from hetrl_cli.artifacts.io import save_artifact
    from runtime.plans import disaggregated, tiny_workload

    config = lab_config(path_sshd, None) + "Host lab-a\n  HostName 127.0.0.2\nHost lab-b\n  HostName 127.0.0.4\n"
    config = config.replace("Host *\n", "Host lab-b\n  ProxyJump gw\nHost *\n")
    (tmp_path / "ssh_config").write_text(config)
    (tmp_path / "hosts.txt").write_text(f"lab-a python={path_sshd.python}\nlab-b python={python_b}\n")
    save_artifact(disaggregated(tiny_workload(), "lab-a/0", "lab-b/0"), tmp_path / "plan.json")
    argv = [HETRL, "run", str(tmp_path / "plan.json"), "--hosts", str(tmp_path / "hosts.txt"), "--engine", "hf",
            "--known-hosts", str(path_sshd.known_hosts), "--ssh-config", str(tmp_path / "ssh_config"),
            "--run-dir", str(tmp_path / "run"), *extra]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=150, cwd=tmp_path, env=hetrl_env())


def test_run_preflight_reaches_aliases_and_a_host_behind_a_jump(path_sshd: SshdHosts, tmp_path: Path) -> None:
    """lab-b's interpreter lacks hetrl: its preflight, through the jump host, says so; lab-a passes."""
    result = run_through_config(path_sshd, tmp_path, "/usr/bin/python3", "--steps", "1")
    assert result.returncode == 1, result.stderr
    report = result.stderr.split("nothing launched:", 1)[1]
    assert "lab-b: hetrl is not installed for /usr/bin/python3" in report
    assert "lab-a:" not in report
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_run_across_an_alias_and_a_jumped_host(path_sshd: SshdHosts, tmp_path: Path) -> None:
    """The workers meet at lab-a's HostName (127.0.0.2): the alias itself resolves nowhere but in the config."""
    result = run_through_config(path_sshd, tmp_path, path_sshd.python, "--steps", "1")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "2 worker(s) on 2 hosts (lab-a x1, lab-b x1)" in result.stderr
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 1
