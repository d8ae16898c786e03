"""The Kubernetes example of docs/deploy.md (examples/k8s/), checked without
a Kubernetes: the YAML is parsed and its wiring checked against millpond's
own parsers.

* the Service is headless, publishes not-ready addresses, selects the pods,
  and its port is the container's and the one in every address;
* the StatefulSet names the Service, starts its pods in parallel, and its
  address list (after Kubernetes' ``$(VAR)`` expansion) has one
  ``<statefulset>-<i>.<service>.<namespace>.svc.cluster.local:<port>`` per
  replica, in ordinal order, which ``millpond.run`` parses;
* the container's arguments parse with ``millpond.run``'s parser, and
  ``-i auto`` on pod ``<statefulset>-<i>`` is process ``i``;
* the local state directory is on a volumeClaimTemplate, the backup is in
  S3, every Secret reference names a key secret.example.yaml defines, and
  no secret is a plain value;
* every ``MILLPOND_*`` variable named in the manifests and docs/deploy.md
  is one millpond reads, and every ``python -m millpond.run`` command in
  docs/deploy.md uses only flags it defines.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import pytest
import yaml

from millpond import run
from millpond.backupkey import backup_key_from_env
from millpond.engine.cluster import ClusterSettings

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "examples" / "k8s"
DEPLOY_MD = REPO / "docs" / "deploy.md"
PACKAGE = REPO / "pysrc" / "millpond"

#: Namespaces the address list is expanded in (it must hold for any).
NAMESPACES = ("default", "stream-jobs")

#: The query parameters of an s3:// backup URI (docs/recovery.md).
S3_URI_PARAMETERS = {"endpoint", "region", "timeout", "stall_timeout", "max_attempts", "max_backoff", "part_size"}


# ---------------------------------------------------------------------------
# Loading


def _docs(name: str) -> List[Dict[str, Any]]:
    with open(K8S / name, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def _one(name: str, kind: str) -> Dict[str, Any]:
    docs = _docs(name)
    assert [d.get("kind") for d in docs] == [kind], f"{name} should hold one {kind}"
    return docs[0]


@pytest.fixture(scope="module")
def service() -> Dict[str, Any]:
    return _one("service.yaml", "Service")


@pytest.fixture(scope="module")
def statefulset() -> Dict[str, Any]:
    return _one("statefulset.yaml", "StatefulSet")


@pytest.fixture(scope="module")
def secrets() -> Dict[str, Dict[str, str]]:
    """Secret name -> its keys and (example) values."""
    out: Dict[str, Dict[str, str]] = {}
    for d in _docs("secret.example.yaml"):
        assert d.get("kind") == "Secret" and d.get("apiVersion") == "v1", d
        data = dict(d.get("stringData") or {})
        for k in d.get("data") or {}:
            data.setdefault(k, "")
        out[d["metadata"]["name"]] = {str(k): str(v) for k, v in data.items()}
    return out


@pytest.fixture(scope="module")
def pod(statefulset: Dict[str, Any]) -> Dict[str, Any]:
    spec: Dict[str, Any] = statefulset["spec"]["template"]["spec"]
    return spec


@pytest.fixture(scope="module")
def container(pod: Dict[str, Any]) -> Dict[str, Any]:
    [c] = [c for c in pod["containers"] if c["name"] == "millpond"]
    return c


# ---------------------------------------------------------------------------
# What Kubernetes would hand the process


_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, defined: Mapping[str, str]) -> str:
    """Kubernetes' expansion of ``$(NAME)`` in an env value, a command or
    an argument: a variable defined earlier is replaced, ``$$`` is ``$``,
    anything else stays as written."""

    def sub(m: "re.Match[str]") -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return defined[name] if name in defined else m.group(0)

    return _REF.sub(sub, text)


def pod_env(container: Dict[str, Any], ordinal: int, namespace: str, sts_name: str) -> Dict[str, str]:
    """The container's environment on pod ``<sts_name>-<ordinal>`` in
    ``namespace``, in order, as Kubernetes builds it: plain values expanded
    against the variables before them, the pod's name and namespace from
    fieldRefs; a secretKeyRef becomes ``<secret NAME/KEY>``."""
    env: Dict[str, str] = {"HOSTNAME": f"{sts_name}-{ordinal}"}
    fields = {"metadata.name": f"{sts_name}-{ordinal}", "metadata.namespace": namespace}
    for e in container.get("env") or []:
        name = e["name"]
        if "value" in e:
            env[name] = expand(str(e["value"]), env)
        elif "fieldRef" in (e.get("valueFrom") or {}):
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            assert path in fields, f"{name}: fieldRef {path} is not one this test knows"
            env[name] = fields[path]
        elif "secretKeyRef" in (e.get("valueFrom") or {}):
            ref = e["valueFrom"]["secretKeyRef"]
            env[name] = f"<secret {ref['name']}/{ref['key']}>"
        else:
            raise AssertionError(f"env {name}: a source this test does not know: {e}")
    return env


def argv(container: Dict[str, Any], env: Mapping[str, str]) -> List[str]:
    """The arguments after ``python -m millpond.run``."""
    command = [expand(str(a), env) for a in container.get("command") or []]
    args = [expand(str(a), env) for a in container.get("args") or []]
    full = command + args
    assert full[:3] == ["python", "-m", "millpond.run"], f"the container should run python -m millpond.run: {full}"
    return full[3:]


def settings(container: Dict[str, Any], ordinal: int, namespace: str, sts_name: str,
             monkeypatch: pytest.MonkeyPatch) -> Tuple[argparse.Namespace, Dict[str, str]]:
    """The container's arguments parsed by millpond.run on pod
    ``<sts_name>-<ordinal>``, with the options no flag set filled in from
    the environment as ``millpond.run`` does; and that environment."""
    env = pod_env(container, ordinal, namespace, sts_name)
    monkeypatch.setenv("HOSTNAME", env["HOSTNAME"])
    try:
        args = run._build_parser().parse_args(argv(container, env))
    except SystemExit as ex:  # argparse's error(): the message went to stderr
        raise AssertionError(f"millpond.run refuses the container's arguments (exit {ex.code})") from None
    for dest, var, convert in run._ENV:
        if getattr(args, dest) is None and env.get(var, "").strip():
            setattr(args, dest, convert(env[var]))
    return args, env


def names(d: Dict[str, Any]) -> str:
    return str(d["metadata"]["name"])


def container_port(container: Dict[str, Any], target: Any) -> int:
    """The container port a Service's ``targetPort`` (a number or a port name) means."""
    for p in container.get("ports") or []:
        if target == p.get("name") or target == p["containerPort"]:
            return int(p["containerPort"])
    raise AssertionError(f"targetPort {target!r} is not a port of the container")


# ---------------------------------------------------------------------------
# The Service and the StatefulSet


def test_kinds_and_api_versions(service: Dict[str, Any], statefulset: Dict[str, Any],
                                secrets: Dict[str, Dict[str, str]]) -> None:
    assert service["apiVersion"] == "v1"
    assert statefulset["apiVersion"] == "apps/v1"
    assert secrets, "secret.example.yaml defines no Secret"
    for doc in (service, statefulset):
        assert "namespace" not in doc["metadata"], "the manifests apply to any namespace (kubectl -n)"


def test_the_service_is_headless_and_publishes_not_ready_pods(service: Dict[str, Any]) -> None:
    spec = service["spec"]
    assert spec["clusterIP"] == "None"
    assert spec["publishNotReadyAddresses"] is True


def test_the_service_and_the_statefulset_select_the_pods(service: Dict[str, Any],
                                                         statefulset: Dict[str, Any]) -> None:
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    for selector in (service["spec"]["selector"], statefulset["spec"]["selector"]["matchLabels"]):
        assert selector, "an empty selector selects everything"
        assert {k: labels.get(k) for k in selector} == selector


def test_the_service_port_is_the_container_port(service: Dict[str, Any], container: Dict[str, Any]) -> None:
    [port] = service["spec"]["ports"]
    assert port.get("protocol", "TCP") == "TCP"
    target = port.get("targetPort", port["port"])
    assert container_port(container, target) == port["port"]


def test_the_statefulset_runs_the_cluster(statefulset: Dict[str, Any], service: Dict[str, Any],
                                          pod: Dict[str, Any], container: Dict[str, Any]) -> None:
    spec = statefulset["spec"]
    assert spec["serviceName"] == names(service)
    assert spec["podManagementPolicy"] == "Parallel"
    assert isinstance(spec["replicas"], int) and spec["replicas"] >= 2
    # A changed template must reach every pod at once (docs/deploy.md).
    assert spec["updateStrategy"]["type"] == "OnDelete"
    grace = pod["terminationGracePeriodSeconds"]
    assert isinstance(grace, int) and grace > 0
    # One process runs on one core.
    cpu = str(container["resources"]["requests"]["cpu"])
    assert cpu in ("1", "1000m"), cpu
    # Python is the container's process: SIGTERM reaches millpond itself.
    assert container["command"][0] == "python"


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_the_addresses_are_the_pods_dns_names_in_ordinal_order(
    namespace: str, statefulset: Dict[str, Any], service: Dict[str, Any], container: Dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sts = names(statefulset)
    replicas = statefulset["spec"]["replicas"]
    [port] = service["spec"]["ports"]
    want = [f"{sts}-{i}.{names(service)}.{namespace}.svc.cluster.local:{port['port']}" for i in range(replicas)]
    for ordinal in range(replicas):
        args, env = settings(container, ordinal, namespace, sts, monkeypatch)
        assert args.addresses == want
        # The same through the public parser, from what the process gets.
        if "MILLPOND_ADDRESSES" in env:
            assert run.parse_addresses(env["MILLPOND_ADDRESSES"]) == want
        assert "$(" not in ";".join(args.addresses), "a $(VAR) that Kubernetes would not expand"


def test_process_id_auto_is_the_pod_ordinal(statefulset: Dict[str, Any], container: Dict[str, Any],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    sts = names(statefulset)
    replicas = statefulset["spec"]["replicas"]
    for ordinal in range(replicas):
        args, _env = settings(container, ordinal, NAMESPACES[0], sts, monkeypatch)
        assert args.process_id == ordinal
        assert run._process_id("auto") == ordinal
        assert 0 <= args.process_id < len(args.addresses)
    # The process id comes from the host name, not a number in the manifest.
    _args, env = settings(container, 0, NAMESPACES[0], sts, monkeypatch)
    a = argv(container, env)
    assert ("-i" in a and a[a.index("-i") + 1] == "auto") or env.get("MILLPOND_PROCESS_ID") == "auto"


def test_the_cluster_settings_are_valid(statefulset: Dict[str, Any], container: Dict[str, Any],
                                        secrets: Dict[str, Dict[str, str]], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """What ClusterSettings.from_env makes of the pod's environment, with
    the secret files replaced by copies of secret.example.yaml's values."""
    sts = names(statefulset)
    args, env = settings(container, 1, NAMESPACES[0], sts, monkeypatch)
    files = _secret_files(statefulset, container, secrets)
    for var, value in env.items():
        if var.startswith("MILLPOND_"):
            if var.endswith("_FILE"):
                copy = tmp_path / var
                copy.write_text(files[PurePosixPath(value)])
                value = str(copy)
            monkeypatch.setenv(var, value)
    assert "MILLPOND_CLUSTER_SECRET" not in env, "the secret should come from a mounted file, not a variable"
    s = ClusterSettings.from_env(args.addresses, args.process_id)
    assert s.secret and s.index == 1 and s.count == statefulset["spec"]["replicas"]
    if "MILLPOND_START_TIMEOUT" in env:
        # Long enough for pods scheduled apart and restart back-off (docs/deploy.md).
        assert s.start_timeout.total_seconds() >= 60
    if "MILLPOND_BACKUP_KEY_FILE" in env:
        assert backup_key_from_env() is not None


# ---------------------------------------------------------------------------
# Volumes, secrets, the backup


def _mounts(container: Dict[str, Any]) -> Dict[str, PurePosixPath]:
    return {m["name"]: PurePosixPath(m["mountPath"]) for m in container.get("volumeMounts") or []}


def _under(path: PurePosixPath, root: PurePosixPath) -> bool:
    return path == root or root in path.parents


def test_the_local_state_is_on_a_volume_claim(statefulset: Dict[str, Any], pod: Dict[str, Any],
                                              container: Dict[str, Any],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    args, _env = settings(container, 0, NAMESPACES[0], names(statefulset), monkeypatch)
    assert args.local_state_dir, "recovery is off without -d"
    state = PurePosixPath(args.local_state_dir)
    assert state.is_absolute()
    claims = {c["metadata"]["name"]: c for c in statefulset["spec"]["volumeClaimTemplates"]}
    pod_volumes = {v["name"] for v in pod.get("volumes") or []}
    assert not pod_volumes & set(claims), "a pod volume shadows a volumeClaimTemplate"
    on = [name for name, root in _mounts(container).items() if _under(state, root)]
    assert on, f"-d {state} is on no mounted volume"
    # The deepest mount holding the directory is the one it is written to.
    name = max(on, key=lambda n: len(_mounts(container)[n].parts))
    assert name in claims, f"-d {state} is on volume {name!r}, which is not a volumeClaimTemplate"
    claim = claims[name]["spec"]
    assert "ReadWriteOnce" in claim["accessModes"]
    assert claim["resources"]["requests"]["storage"]


def _secret_files(statefulset: Dict[str, Any], container: Dict[str, Any],
                  secrets: Dict[str, Dict[str, str]]) -> Dict[PurePosixPath, str]:
    """Every file a Secret volume puts in the container -> its example value;
    fails on a volume naming a Secret or key secret.example.yaml lacks."""
    pod = statefulset["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in container.get("volumeMounts") or []}
    files: Dict[PurePosixPath, str] = {}
    for v in pod.get("volumes") or []:
        if "secret" not in v:
            continue
        src = v["secret"]
        assert src["secretName"] in secrets, f"volume {v['name']}: no Secret {src['secretName']!r} in secret.example.yaml"
        data = secrets[src["secretName"]]
        items = src.get("items") or [{"key": k, "path": k} for k in data]
        mount = mounts.get(v["name"])
        if mount is None:
            continue
        assert mount.get("readOnly") is True, f"the secret volume {v['name']} should be mounted read-only"
        assert "subPath" not in mount
        for item in items:
            assert item["key"] in data, f"volume {v['name']}: Secret {src['secretName']} has no key {item['key']!r}"
            files[PurePosixPath(mount["mountPath"]) / item["path"]] = data[item["key"]]
    return files


def test_secret_references_name_keys_the_example_defines(statefulset: Dict[str, Any], container: Dict[str, Any],
                                                         secrets: Dict[str, Dict[str, str]]) -> None:
    files = _secret_files(statefulset, container, secrets)
    for e in container.get("env") or []:
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if ref is not None:
            assert ref["name"] in secrets, f"{e['name']}: no Secret {ref['name']!r} in secret.example.yaml"
            assert ref["key"] in secrets[ref["name"]], f"{e['name']}: Secret {ref['name']} has no key {ref['key']!r}"
        if e["name"].endswith("_FILE") and e["name"].startswith("MILLPOND_"):
            assert PurePosixPath(e["value"]) in files, f"{e['name']}={e['value']} is no file of a mounted Secret"
    env = {e["name"]: e for e in container.get("env") or []}
    # Processes on different pods need the cluster secret (non-loopback
    # addresses), from one source.
    assert ("MILLPOND_CLUSTER_SECRET" in env) != ("MILLPOND_CLUSTER_SECRET_FILE" in env)


def test_no_secret_is_a_plain_value(container: Dict[str, Any]) -> None:
    secretish = re.compile(r"SECRET|TOKEN|PASSWORD|(^|_)KEY($|_)")
    for e in container.get("env") or []:
        name = e["name"]
        if secretish.search(name) and not name.endswith("_FILE") and name != "AWS_ACCESS_KEY_ID":
            assert "value" not in e, f"{name} should come from a Secret, not a value in the manifest"
    aws = {e["name"]: e for e in container.get("env") or [] if e["name"].startswith("AWS_")}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        if name in aws:
            assert "secretKeyRef" in (aws[name].get("valueFrom") or {}), f"{name} should come from a Secret"


def test_the_backup_is_in_s3(statefulset: Dict[str, Any], container: Dict[str, Any],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    from urllib.parse import parse_qs, urlsplit

    args, _env = settings(container, 0, NAMESPACES[0], names(statefulset), monkeypatch)
    assert args.backup, "no -b/MILLPOND_BACKUP: the backup would be on the pod's own volume"
    uri = urlsplit(args.backup)
    assert uri.scheme == "s3" and uri.netloc, args.backup
    assert set(parse_qs(uri.query)) <= S3_URI_PARAMETERS, args.backup
    # Every pod must name the same backup.
    for ordinal in range(1, statefulset["spec"]["replicas"]):
        other, _ = settings(container, ordinal, NAMESPACES[1], names(statefulset), monkeypatch)
        assert other.backup == args.backup


# ---------------------------------------------------------------------------
# Names millpond really reads, flags it really has


def _package_strings() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py"))


def _deploy_files() -> Iterator[Path]:
    yield from sorted(p for p in K8S.iterdir() if p.is_file())
    yield DEPLOY_MD


def test_every_millpond_variable_named_is_one_millpond_reads() -> None:
    source = _package_strings()
    seen = {}
    for path in _deploy_files():
        for name in re.findall(r"\bMILLPOND_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")):
            seen.setdefault(name, path.relative_to(REPO))
    assert "MILLPOND_ADDRESSES" in seen or "MILLPOND_PROCESS_ID" in seen
    unknown = {n: str(p) for n, p in seen.items() if f'"{n}"' not in source}
    assert not unknown, f"variables millpond does not read (no \"NAME\" in pysrc/millpond): {unknown}"


def _shell_commands(markdown: str) -> Iterator[str]:
    """The shell lines of the fenced code blocks, continuations joined and a
    ``$ `` prompt dropped."""
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", markdown, flags=re.M | re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip()
            if line.startswith("$ "):
                line = line[2:]
            yield line


def _millpond_run_argv(line: str) -> Optional[List[str]]:
    """The arguments of a ``python -m millpond.run`` command (after any
    ``VAR=value`` prefixes), without a trailing ``# comment``; else None."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:
        return None
    while tokens and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0]):
        tokens = tokens[1:]
    if tokens[:3] != ["python", "-m", "millpond.run"]:
        return None
    return tokens[3:]


def _real_flags() -> Dict[str, argparse.Action]:
    """The option strings millpond.run takes (not the Bytewax ones it refuses)."""
    return {
        s: a
        for a in run._build_parser()._actions
        if a.help != argparse.SUPPRESS
        for s in a.option_strings
    }


def test_deploy_md_commands_use_only_real_flags() -> None:
    flags = _real_flags()
    commands = [a for a in map(_millpond_run_argv, _shell_commands(DEPLOY_MD.read_text(encoding="utf-8"))) if a]
    assert commands, "docs/deploy.md shows no python -m millpond.run command"
    for a in commands:
        for token in a:
            if token.startswith("-") and not re.fullmatch(r"-\d.*", token):
                assert token.split("=", 1)[0] in flags, f"{token} is no flag of python -m millpond.run: {a}"


def test_the_manifest_flags_are_real(statefulset: Dict[str, Any], container: Dict[str, Any]) -> None:
    flags = _real_flags()
    for token in container.get("args") or []:
        token = str(token)
        if token.startswith("-"):
            assert token.split("=", 1)[0] in flags, token


def test_the_dockerfile_user_is_the_pods(pod: Dict[str, Any]) -> None:
    text = (K8S / "Dockerfile").read_text(encoding="utf-8")
    [uid] = re.findall(r"useradd[^\n]*--uid (\d+)", text)
    assert re.search(rf"^USER {uid}$", text, flags=re.M)
    ctx = pod["securityContext"]
    assert ctx["runAsUser"] == int(uid) and ctx["fsGroup"] == ctx["runAsGroup"]


def test_a_fresh_clone_installs_pyyaml() -> None:
    """make's venv installs '.[test]'; this module needs PyYAML from it."""
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    [test_extra] = re.findall(r"^test = \[(.*?)^\]", pyproject, flags=re.M | re.S)
    assert re.search(r'"pyyaml\b', test_extra, flags=re.I), "add pyyaml to the test extra in pyproject.toml"
    assert "-e '.[test]'" in (REPO / "Makefile").read_text(encoding="utf-8")


def test_the_docs_link_the_deploy_guide() -> None:
    assert "(docs/deploy.md)" in (REPO / "README.md").read_text(encoding="utf-8")
    assert "(deploy.md)" in (REPO / "docs" / "cluster.md").read_text(encoding="utf-8")
