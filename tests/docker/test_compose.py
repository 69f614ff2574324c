"""Static checks of the docker stack (``docker/``): compose file, ``.env.example``, Dockerfiles.

No Docker engine runs where these tests run, so nothing here builds an image or starts a container.
What is checked, and how:

- ``docker compose config`` (Compose v2) on ``docker/compose.yaml`` with ``docker/.env.example``, only
  where a Compose v2 binary exists (``docker compose`` plugin or ``docker-compose`` v2); skipped otherwise.
- ``docker-compose config`` (Debian's Compose v1.29) likewise where it is installed, plus the two rules
  that keep the file valid for it: no top-level ``name:`` and no nested ``${A:-${B}}`` defaults.
- Compose's variable interpolation, re-implemented here per the Compose spec (``${VAR}``, ``${VAR:-d}``,
  ``${VAR-d}``, ``${VAR:?err}``, ``${VAR?err}``, ``${VAR:+r}``, ``$$``, nesting), driven by
  ``.env.example``: every variable the compose file uses is documented there, the documented values
  are the compose defaults, and a missing ``POSTGRES_PASSWORD`` stops compose with a clear message.
- The interpolated file validates against the Compose Specification JSON schema (vendored in
  ``docker/schema/``), and a broken copy does not (so the schema check is live).
- Structure: images/builds, healthchecks on every long-running service, ``depends_on`` targets and
  conditions, declared volumes, the ``gpu`` profile with an NVIDIA device reservation, and that the URLs
  the workers use point at the right service names, ports and databases (created by
  ``docker/postgres-init``).
- Dockerfiles: parsed into instructions (with BuildKit's own parser through the ``dockerfile`` package
  when installed, which also cross-checks the small parser below), then the base images, the torch pin
  (equal to ``pyproject.toml``'s), ``pip install .``, the non-root user, the env and the volume, and no
  BuildKit-only feature (the legacy builder of docker-compose 1.29 builds them; no ``# syntax=`` frontend
  pull). The root ``.dockerignore`` keeps the package sources and drops ``.venv``/``.git``/``.env``.

The images really built and the stack really running are ``make stack-test`` (``docker/stack_test.py``).

Whether the server commands in compose really start (against a real PostgreSQL) is tested in
``tests/docker/test_stack.py``.
"""

from __future__ import annotations

import copy
import fnmatch
import importlib.metadata
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml
from dotenv import dotenv_values

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
OVERRIDE_FILE = DOCKER / "stack-test.override.yaml"
SCHEMA_FILE = DOCKER / "schema" / "compose-spec.json"
TEST_PASSWORD = "test-password-1234"  # what a user puts into docker/.env

# Services that run once and exit; everything else is long-running and must have a healthcheck.
ONE_SHOT = {"deploy"}
SECRETS = {"POSTGRES_PASSWORD", "SPECDEC_ALERT_CHANNELS", "SPECDEC_WATCH_SECRET", "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY"}


# ----------------------------------------------------------------------------------------------
# Compose interpolation (https://github.com/compose-spec/compose-spec/blob/main/spec.md#interpolation)
# ----------------------------------------------------------------------------------------------
class InterpolationError(ValueError):
    """A ``${VAR:?message}`` / ``${VAR?message}`` whose variable is missing, or a malformed reference."""


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _closing_brace(s: str, start: int) -> int:
    """Index of the ``}`` closing the ``${`` whose body starts at ``start`` (nesting-aware)."""
    depth, i = 1, start
    while i < len(s):
        if s.startswith("$$", i):
            i += 2
            continue
        if s.startswith("${", i):
            depth += 1
            i += 2
            continue
        if s[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise InterpolationError(f"unclosed '${{' in {s!r}")


def interpolate(s: str, env: dict[str, str], used: set[str] | None = None) -> str:
    """Substitute Compose-style variable references in ``s`` from ``env``.

    Args:
        s: a string value from a compose file.
        env: variable values (the ``.env`` file plus overrides); a key with value ``""`` is set-but-empty.
        used: if given, the names of all referenced variables are added to it.
    Returns:
        The substituted string (``$$`` becomes ``$``).
    Raises:
        InterpolationError: a required variable is missing (message as compose prints it) or bad syntax.
    """
    out, i = [], 0
    while i < len(s):
        if s.startswith("$$", i):
            out.append("$")
            i += 2
        elif s.startswith("${", i):
            end = _closing_brace(s, i + 2)
            body = s[i + 2:end]
            m = _NAME.match(body)
            if not m:
                raise InterpolationError(f"invalid interpolation format in {s!r}")
            name, rest = m.group(0), body[m.end():]
            if used is not None:
                used.add(name)
            val, is_set = env.get(name), name in env
            nonempty = bool(val)
            if rest == "":
                out.append(val or "")
            else:
                for op in (":-", ":?", ":+", "-", "?", "+"):
                    if rest.startswith(op):
                        arg = rest[len(op):]
                        break
                else:
                    raise InterpolationError(f"invalid interpolation format in {s!r}")
                cond = nonempty if op.startswith(":") else is_set
                kind = op[-1]
                if kind == "-":
                    out.append(val if cond else interpolate(arg, env, used))
                elif kind == "?":
                    if not cond:
                        raise InterpolationError(f"required variable {name} is missing a value: "
                                                 f"{interpolate(arg, env, used)}")
                    out.append(val)
                else:  # "+"
                    out.append(interpolate(arg, env, used) if cond else "")
            i = end + 1
        elif s[i] == "$" and (m := _NAME.match(s, i + 1)):
            if used is not None:
                used.add(m.group(0))
            out.append(env.get(m.group(0)) or "")
            i = m.end()
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def interpolate_tree(node, env: dict[str, str], used: set[str] | None = None):
    """Apply :func:`interpolate` to every string value (not key) of a parsed YAML tree."""
    if isinstance(node, dict):
        return {k: interpolate_tree(v, env, used) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate_tree(v, env, used) for v in node]
    if isinstance(node, str):
        return interpolate(node, env, used)
    return node


def env_example() -> dict[str, str]:
    """``docker/.env.example`` as compose reads it (no interpolation inside values is used there)."""
    return {k: (v or "") for k, v in dotenv_values(ENV_EXAMPLE, interpolate=False).items()}


def raw_compose() -> dict:
    """``docker/compose.yaml`` parsed (YAML anchors and ``<<`` merges resolved), not interpolated."""
    return yaml.safe_load(COMPOSE_FILE.read_text())


def resolved_compose(**overrides: str) -> dict:
    """The compose file interpolated with ``.env.example`` plus a password (and ``overrides``)."""
    env = {**env_example(), "POSTGRES_PASSWORD": TEST_PASSWORD, **overrides}
    return interpolate_tree(raw_compose(), env)


def service_argv(service: dict) -> list[str]:
    """The full argv a service's container runs: ``entrypoint`` + ``command`` (both exec form here)."""
    ep, cmd = service.get("entrypoint", []), service.get("command", [])
    assert isinstance(ep, list) and isinstance(cmd, list), "use exec form (lists) for entrypoint/command"
    return [str(a) for a in ep + cmd]


def flag_value(argv: list[str], flag: str) -> str:
    """Value following ``flag`` in ``argv`` (``--flag value`` form)."""
    assert flag in argv, f"{flag} missing from {argv}"
    return argv[argv.index(flag) + 1]


def healthcheck_url(service: dict) -> str:
    """The URL a ``["CMD", "python", "-c", "...urlopen('URL'...)"]`` healthcheck fetches."""
    test = service["healthcheck"]["test"]
    m = re.search(r"urlopen\('([^']+)'", " ".join(test))
    assert m, f"healthcheck does not fetch a URL: {test}"
    return m.group(1)


def _find_compose(major: str) -> list[str] | None:
    """The command of an installed Compose CLI of the given major version ("1" or "2"), or None."""
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if not shutil.which(cmd[0]):
            continue
        try:
            r = subprocess.run([*cmd, "version", "--short"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0 and re.match(rf"v?{major}\.", r.stdout.strip()):
            return cmd
    return None


# ----------------------------------------------------------------------------------------------
# Compose: the real CLI where it exists
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", [None, "gpu"])
def test_docker_compose_config_cli(profile, tmp_path):
    compose = _find_compose("2")
    if compose is None:
        pytest.skip("no Compose v2 binary here (`docker compose` plugin / docker-compose v2); the schema "
                    "and structure tests below stand in for it")
    import os

    env = {**os.environ, "POSTGRES_PASSWORD": TEST_PASSWORD}
    args = [*compose, "-f", str(COMPOSE_FILE), "--env-file", str(ENV_EXAMPLE)]
    if profile:
        args += ["--profile", profile]
    r = subprocess.run([*args, "config", "--format", "json"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    services = json.loads(r.stdout)["services"]
    assert ("gpu-worker" in services) == (profile == "gpu")
    # Compose's own interpolation agrees with the one the other tests use (`config` re-escapes $ as $$).
    ours = resolved_compose()["services"]
    unescape = lambda v: json.loads(json.dumps(v).replace("$$", "$"))  # noqa: E731
    for name, svc in services.items():
        for key in ("image", "entrypoint", "command", "environment", "working_dir", "profiles"):
            want = ours[name].get(key)
            if key == "environment" and want is not None:
                want = {k: str(v) for k, v in want.items()}
            assert unescape(svc.get(key)) == want, f"{name}.{key}"

    env.pop("POSTGRES_PASSWORD")
    r = subprocess.run([*args, "config", "--quiet"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0 and "POSTGRES_PASSWORD" in r.stderr


def test_docker_compose_v1_config_cli():
    """Debian's docker-compose 1.29 accepts the file (with the stack-test override), interpolates it as
    the other tests do, and refuses it without POSTGRES_PASSWORD."""
    compose = _find_compose("1")
    if compose is None:
        pytest.skip("no docker-compose 1.x here (Debian: apt-get install docker-compose)")
    import os

    env = {**os.environ, "POSTGRES_PASSWORD": TEST_PASSWORD}
    args = [*compose, "-p", "specdec", "-f", str(COMPOSE_FILE), "--env-file", str(ENV_EXAMPLE)]
    r = subprocess.run([*args, "config"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    services = yaml.safe_load(r.stdout)["services"]
    ours = resolved_compose()["services"]
    unescape = lambda v: json.loads(json.dumps(v).replace("$$", "$"))  # noqa: E731
    for name in ours:
        if name == "gpu-worker":
            continue  # 1.29 lists profiled services too; compared below
        for key in ("image", "entrypoint", "command", "environment", "working_dir"):
            want = ours[name].get(key)
            if key == "environment" and want is not None:
                want = {k: str(v) for k, v in want.items()}
            got = unescape(services[name].get(key))
            if key == "command" and isinstance(want, str):
                got = got if isinstance(got, str) else got[0]
            assert got == want, f"{name}.{key}"
    r = subprocess.run([*args, "-f", str(OVERRIDE_FILE), "config", "-q"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    env.pop("POSTGRES_PASSWORD")
    r = subprocess.run([*args, "config", "-q"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0 and "POSTGRES_PASSWORD" in r.stderr


def test_compose_file_stays_valid_for_compose_v1():
    raw = raw_compose()
    assert "name" not in raw, "docker-compose 1.29 refuses a top-level `name:`; use -p / COMPOSE_PROJECT_NAME"
    def strings(node):
        if isinstance(node, dict):
            yield from (x for v in node.values() for x in strings(v))
        elif isinstance(node, list):
            yield from (x for v in node for x in strings(v))
        elif isinstance(node, str):
            yield node

    nested = [v for v in strings(raw) if re.search(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?[-?+][^}]*(?<!\$)\$\{", v)]
    assert not nested, f"docker-compose 1.29 does not expand nested defaults: {nested}"


# ----------------------------------------------------------------------------------------------
# Interpolation and .env.example
# ----------------------------------------------------------------------------------------------
def test_interpolation_rules():
    env = {"A": "a", "E": ""}
    assert interpolate("${A}-${E}-${U}", env) == "a--"
    assert interpolate("${E:-d}|${E-d}|${U-d}|${A:-d}", env) == "d||d|a"
    assert interpolate("${E:+r}|${E+r}|${U+r}|${A:+r}", env) == "|r||r"
    assert interpolate("$$A $A ${U:-x${A}y}", env) == "$A a xay"
    assert interpolate("${E?e}", env) == ""
    with pytest.raises(InterpolationError, match="U is missing a value: needs U"):
        interpolate("${U?needs U}", env)
    with pytest.raises(InterpolationError, match="E is missing"):
        interpolate("${E:?}", env)
    with pytest.raises(InterpolationError):
        interpolate("${A", env)


def test_env_example_documents_every_variable_and_its_default():
    raw = COMPOSE_FILE.read_text()
    env = env_example()
    used: set[str] = set()
    interpolate_tree(raw_compose(), {**env, "POSTGRES_PASSWORD": TEST_PASSWORD}, used)
    assert used == set(env), (f"used in compose but not in .env.example: {sorted(used - set(env))}; "
                              f"in .env.example but unused: {sorted(set(env) - used)}")
    # Each documented value is either empty (compose default applies) or the compose default itself,
    # so .env.example never disagrees with what compose does without a .env.
    for name, default in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*):-((?:[^{}]|\{[^{}]*\})*)\}", raw):
        default = interpolate(default, env)
        assert env[name] in ("", default), f"{name}: .env.example has {env[name]!r}, compose default {default!r}"
    for name in SECRETS:
        assert env[name] == "", f"{name} is a secret: leave it empty in .env.example"
        comment = ENV_EXAMPLE.read_text().split(f"\n{name}=")[0].rsplit("\n\n", 1)[-1]
        assert "Secret" in comment, f"{name} needs a comment saying it is a secret"


def test_missing_password_stops_compose_with_a_clear_message():
    with pytest.raises(InterpolationError, match=r"POSTGRES_PASSWORD is missing a value: set POSTGRES_PASSWORD in docker/\.env"):
        interpolate_tree(raw_compose(), env_example())


# ----------------------------------------------------------------------------------------------
# Compose Specification schema
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compose_validator():
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_compose_matches_the_compose_spec_schema(compose_validator):
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in compose_validator.iter_errors(resolved_compose())]
    assert not errors, "\n".join(errors)
    override = yaml.safe_load(OVERRIDE_FILE.read_text())
    assert not list(compose_validator.iter_errors(override))
    assert set(override["services"]) <= set(resolved_compose()["services"])


@pytest.mark.parametrize("breakage", ["unknown_service_key", "bad_healthcheck", "bad_depends_condition",
                                      "bad_device_reservation", "misspelled_top_level"])
def test_schema_check_rejects_broken_compose(compose_validator, breakage):
    doc = copy.deepcopy(resolved_compose())
    svc = doc["services"]
    if breakage == "unknown_service_key":
        svc["mlflow"]["comand"] = ["server"]
    elif breakage == "bad_healthcheck":
        svc["postgres"]["healthcheck"]["tset"] = svc["postgres"]["healthcheck"].pop("test")
    elif breakage == "bad_depends_condition":
        svc["worker"]["depends_on"]["mlflow"]["condition"] = "healthy"
    elif breakage == "bad_device_reservation":
        svc["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] = "gpu"
    else:
        doc["volume"] = doc.pop("volumes")
    assert list(compose_validator.iter_errors(doc)), f"schema accepted a compose file with {breakage}"


# ----------------------------------------------------------------------------------------------
# Structure
# ----------------------------------------------------------------------------------------------
def test_services_images_builds_and_healthchecks():
    svcs = resolved_compose()["services"]
    assert {"postgres", "mlflow", "prefect-server", "deploy", "worker", "gpu-worker"} <= set(svcs)
    for name, svc in svcs.items():
        assert svc.get("image"), f"{name}: no image"
        if "build" in svc:
            assert (DOCKER / svc["build"]["context"]).resolve() == REPO, f"{name}: build context is not the repo"
            assert (REPO / svc["build"]["dockerfile"]).is_file(), f"{name}: missing Dockerfile"
        if name in ONE_SHOT:
            assert svc.get("restart") == "no", f"{name}: a one-shot must not restart"
        else:
            assert svc.get("restart") == "unless-stopped", f"{name}: long-running service without restart"
            hc = svc.get("healthcheck", {})
            assert hc.get("test") and not hc.get("disable"), f"{name}: long-running service without healthcheck"
            assert hc["test"][0] in ("CMD", "CMD-SHELL")
    assert svcs["postgres"]["image"].split(":")[0] == "postgres" and svcs["postgres"]["image"].endswith(":16")
    assert "pg_isready" in " ".join(svcs["postgres"]["healthcheck"]["test"])
    cpu = {"image": svcs["mlflow"]["image"], "dockerfile": "docker/Dockerfile.cpu"}
    for name in ("mlflow", "prefect-server", "deploy", "worker"):
        assert svcs[name]["image"] == cpu["image"] and svcs[name]["build"]["dockerfile"] == cpu["dockerfile"]
    assert svcs["gpu-worker"]["build"]["dockerfile"] == "docker/Dockerfile.cuda"
    assert svcs["gpu-worker"]["image"] != cpu["image"]


def test_depends_on_graph():
    svcs = resolved_compose()["services"]
    for name, svc in svcs.items():
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: use the long depends_on form with conditions"
        for dep, spec in deps.items():
            assert dep in svcs, f"{name} depends on unknown service {dep}"
            assert dep != name
            cond = spec["condition"]
            if dep in ONE_SHOT:
                assert cond == "service_completed_successfully", f"{name} -> {dep}"
            else:
                assert cond == "service_healthy", f"{name} -> {dep}: wait for health, not start"
                assert "healthcheck" in svcs[dep]
            # a service outside a profile must never need one inside a profile
            if not svc.get("profiles"):
                assert not svcs[dep].get("profiles"), f"{name} (always on) depends on profiled {dep}"

    def reaches(a: str, b: str, seen=()) -> bool:
        return any(d == b or (d not in seen and reaches(d, b, (*seen, d))) for d in svcs[a].get("depends_on", {}))

    assert not any(reaches(s, s) for s in svcs), "dependency cycle"
    for s in ("mlflow", "prefect-server"):
        assert "postgres" in svcs[s]["depends_on"]
    for w in ("worker", "gpu-worker"):
        assert {"postgres", "mlflow", "prefect-server", "deploy"} <= set(svcs[w]["depends_on"])


def test_volumes_declared_and_mounted_where_the_images_expect_them():
    doc = resolved_compose()
    declared = set(doc.get("volumes", {}))
    used = set()
    for name, svc in doc["services"].items():
        for v in svc.get("volumes", []):
            src, target = v.split(":")[:2]
            if src.startswith((".", "/")):
                assert (DOCKER / src).exists(), f"{name}: bind mount source {src} missing"
            else:
                assert src in declared, f"{name}: volume {src} not declared"
                used.add(src)
    assert used == declared, f"declared but unused volumes: {declared - used}"
    mounts = {n: {v.split(":")[1]: v.split(":")[0] for v in s.get("volumes", [])} for n, s in doc["services"].items()}
    assert mounts["postgres"]["/var/lib/postgresql/data"] == "postgres-data"
    assert mounts["postgres"]["/docker-entrypoint-initdb.d"] == "./postgres-init"
    assert mounts["mlflow"]["/mlartifacts"] == "mlflow-artifacts"
    assert flag_value(service_argv(doc["services"]["mlflow"]), "--artifacts-destination") == "/mlartifacts"
    assert mounts["worker"]["/data/specdec"] == mounts["gpu-worker"]["/data/specdec"] == "specdec-data"


def test_gpu_profile():
    svcs = resolved_compose()["services"]
    profiled = {n for n, s in svcs.items() if s.get("profiles")}
    assert profiled == {"gpu-worker", "prometheus", "watch"} and svcs["gpu-worker"]["profiles"] == ["gpu"]
    assert svcs["prometheus"]["profiles"] == ["production"]  # optional Prometheus for production acceptance
    assert svcs["watch"]["profiles"] == ["watch"]  # optional MLflow webhook receiver (specdec pair watch)
    gpu = svcs["gpu-worker"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}]
    assert resolved_compose(SPECDEC_GPU_DEVICE="3")["services"]["gpu-worker"]["deploy"]["resources"][
        "reservations"]["devices"][0]["device_ids"] == ["3"]
    argv = service_argv(gpu)
    assert argv[:3] == ["prefect", "worker", "start"]
    assert flag_value(argv, "--pool") == "gpu-pool" and flag_value(argv, "--type") == "process"
    assert flag_value(argv, "--limit") == "1", "one flow run at a time per GPU"
    assert gpu["environment"]["SPECDEC_DEVICE"] == "cuda"


def test_worker_and_deploy_commands():
    svcs = resolved_compose()["services"]
    argv = service_argv(svcs["worker"])
    assert argv[:3] == ["prefect", "worker", "start"]
    assert flag_value(argv, "--pool") == "cpu-pool" and flag_value(argv, "--type") == "process"
    assert "--with-healthcheck" in argv
    assert svcs["worker"]["environment"]["SPECDEC_DEVICE"] == "cpu"
    for w in ("worker", "gpu-worker"):
        # `--with-healthcheck` serves on PREFECT_WORKER_WEBSERVER_PORT, default 8080
        port = svcs[w]["environment"].get("PREFECT_WORKER_WEBSERVER_PORT", "8080")
        assert urlsplit(healthcheck_url(svcs[w])).port == int(port)
        assert urlsplit(healthcheck_url(svcs[w])).path == "/health"
        assert svcs[w].get("init") is True, "process workers spawn flow runs: reap them"
    deploy = service_argv(svcs["deploy"])
    assert deploy[:2] == ["/bin/sh", "-c"] and len(deploy) == 3
    script = [ln.strip() for ln in deploy[2].strip().splitlines()]
    assert script[0] == "set -e" and script[-1] == "exec prefect --no-prompt deploy --all"
    # --no-prompt deploys refuse missing pools: both pools exist before the deploy
    assert "for pool in cpu-pool gpu-pool; do" in script
    assert 'prefect work-pool inspect "$pool" > /dev/null 2>&1 || prefect work-pool create "$pool" --type process' in script
    assert svcs["deploy"]["working_dir"] == "/app", "prefect.yaml is read from the image's /app"


def test_urls_point_at_the_right_services_ports_and_databases():
    env = {**env_example(), "POSTGRES_PASSWORD": TEST_PASSWORD}
    svcs = resolved_compose()["services"]
    created = set(re.findall(r"CREATE\s+DATABASE\s+(\w+)", "\n".join(
        p.read_text() for p in sorted((DOCKER / "postgres-init").glob("*.sql"))), re.I))
    assert created == {"mlflow", "prefect"}

    mlflow = service_argv(svcs["mlflow"])
    assert mlflow[:2] == ["mlflow", "server"]
    mlflow_port = int(flag_value(mlflow, "--port"))
    assert flag_value(mlflow, "--host") == "0.0.0.0"
    backend = urlsplit(flag_value(mlflow, "--backend-store-uri"))
    assert backend.scheme == "postgresql+psycopg" and backend.hostname == "postgres" and backend.port == 5432
    assert (backend.username, backend.password) == (env["POSTGRES_USER"], TEST_PASSWORD)
    assert backend.path == "/mlflow", "MLflow needs its own database (alembic_version clash)"
    assert "--serve-artifacts" in mlflow
    assert urlsplit(healthcheck_url(svcs["mlflow"])).port == mlflow_port
    assert urlsplit(healthcheck_url(svcs["mlflow"])).path == "/health"

    prefect = service_argv(svcs["prefect-server"])
    assert prefect[:3] == ["prefect", "server", "start"]
    prefect_port = int(flag_value(prefect, "--port"))
    assert flag_value(prefect, "--host") == "0.0.0.0"
    db = urlsplit(svcs["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"])
    assert db.scheme == "postgresql+asyncpg" and db.hostname == "postgres" and db.path == "/prefect"
    assert urlsplit(healthcheck_url(svcs["prefect-server"])).port == prefect_port
    assert urlsplit(healthcheck_url(svcs["prefect-server"])).path == "/api/health"
    assert svcs["prefect-server"]["environment"]["PREFECT_UI_API_URL"] == "http://localhost:4200/api"
    assert resolved_compose(PREFECT_UI_API_URL="http://localhost:14200/api")["services"]["prefect-server"][
        "environment"]["PREFECT_UI_API_URL"] == "http://localhost:14200/api"

    published = {n: [p.rsplit(":", 1)[1] for p in s.get("ports", [])] for n, s in svcs.items()}
    assert published["mlflow"] == [str(mlflow_port)] and published["prefect-server"] == [str(prefect_port)]
    assert all(p.startswith("127.0.0.1:") for s in svcs.values() for p in s.get("ports", [])), \
        "by default the UIs are published on loopback only"
    assert not svcs["postgres"].get("ports"), "Postgres stays on the internal network"

    allowed = flag_value(mlflow, "--allowed-hosts").split(",")
    for name in ("deploy", "worker", "gpu-worker"):
        e = svcs[name]["environment"]
        api = urlsplit(e["PREFECT_API_URL"])
        assert (api.hostname, api.port, api.path) == ("prefect-server", prefect_port, "/api")
        tracking = urlsplit(e["MLFLOW_TRACKING_URI"])
        assert (tracking.hostname, tracking.port) == ("mlflow", mlflow_port)
        # MLflow's host-header check (mlflow.server.security_utils.is_allowed_host_header semantics)
        assert any(fnmatch.fnmatch(tracking.netloc, a) if "*" in a else tracking.netloc == a for a in allowed), \
            f"MLflow would refuse Host: {tracking.netloc}"
        hist = urlsplit(e["SPECDEC_DB_URL"])
        assert hist.scheme == "postgresql+psycopg" and hist.hostname == "postgres"
        assert hist.path == "/" + env["POSTGRES_DB"], "history lives in POSTGRES_DB"
        assert json.loads(e["SPECDEC_ALERT_CHANNELS"]) == []
        assert e["SPECDEC_NIGHTLY_CRON"] == "0 2 * * *"
    for n in ("localhost:5000", "127.0.0.1:5000"):  # the published UI
        assert any(fnmatch.fnmatch(n, a) if "*" in a else n == a for a in allowed)
    assert not any(fnmatch.fnmatch("evil.example:5000", a) if "*" in a else a == "evil.example:5000"
                   for a in allowed)


def test_alert_channels_pass_through_from_env():
    channels = '[{"type": "slack", "url": "https://hooks.slack.com/services/T/B/X"}]'
    svcs = resolved_compose(SPECDEC_ALERT_CHANNELS=channels)["services"]
    assert svcs["worker"]["environment"]["SPECDEC_ALERT_CHANNELS"] == channels
    assert svcs["gpu-worker"]["environment"]["SPECDEC_ALERT_CHANNELS"] == channels


def test_service_programs_are_installed_console_scripts():
    scripts = {ep.name for ep in importlib.metadata.entry_points(group="console_scripts")}
    for name, svc in resolved_compose()["services"].items():
        if "build" in svc and name not in ONE_SHOT:
            assert service_argv(svc)[0] in scripts, f"{name}: {service_argv(svc)[0]} is not installed by pip install ."


# ----------------------------------------------------------------------------------------------
# Dockerfiles
# ----------------------------------------------------------------------------------------------
def parse_dockerfile(path: Path) -> list[tuple[str, str]]:
    """Instructions of a Dockerfile as ``(INSTRUCTION, rest)``: comments dropped, ``\\`` continuations
    joined, the ``# syntax=`` parser directive ignored. A small parser; see the cross-check below."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue  # comment lines inside a continuation are skipped by BuildKit too
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, f"{path}: dangling line continuation"
    return out


KNOWN = {"FROM", "ARG", "ENV", "RUN", "WORKDIR", "COPY", "ADD", "USER", "VOLUME", "ENTRYPOINT", "CMD",
         "EXPOSE", "LABEL", "HEALTHCHECK", "SHELL", "STOPSIGNAL", "ONBUILD"}


def _env_pairs(instrs) -> dict[str, str]:
    env = {}
    for word, rest in instrs:
        if word == "ENV":
            for m in re.finditer(r"(\w+)=(\"[^\"]*\"|\S+)", rest):
                env[m.group(1)] = m.group(2).strip('"')
    return env


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_dockerfile_parses_with_buildkit_parser(name):
    dockerfile = pytest.importorskip("dockerfile", reason="`pip install dockerfile` (BuildKit's parser) for this check")
    cmds = dockerfile.parse_file(str(DOCKER / name))
    ours = parse_dockerfile(DOCKER / name)
    assert [c.cmd.upper() for c in cmds] == [w for w, _ in ours]
    assert all(c.cmd.upper() in KNOWN for c in cmds)


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_dockerfile_contents(name):
    instrs = parse_dockerfile(DOCKER / name)
    words = [w for w, _ in instrs]
    assert set(words) <= KNOWN, set(words) - KNOWN
    text = "\n".join(f"{w} {r}" for w, r in instrs)
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    froms = [r for w, r in instrs if w == "FROM"]
    assert len(froms) == 1
    base = interpolate(froms[0], args)
    assert not re.search(r"(?m)^#\s*syntax=", (DOCKER / name).read_text()), \
        "a `# syntax=` directive makes BuildKit pull a frontend image (fails offline)"
    assert not any(r.startswith("--mount") for w, r in instrs if w == "RUN"), \
        "RUN --mount needs BuildKit; docker-compose 1.29 builds with the legacy builder"
    if name == "Dockerfile.cpu":
        assert base.startswith("python:3.11-slim")
        assert froms[0] == "${PYTHON_BASE_IMAGE}", "the base is a build arg (local stand-ins)"
        assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    else:
        assert base.startswith("nvidia/cuda:") and "-ubuntu" in base
        cuda = re.match(r"nvidia/cuda:(\d+)\.(\d+)", base).groups()
        assert args["TORCH_INDEX_URL"] == f"https://download.pytorch.org/whl/cu{cuda[0]}{cuda[1]}", \
            "torch's CUDA variant must match the base image's CUDA version"
        assert "torch.version.cuda" in text, "the build asserts a CUDA build of torch"

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(d for d in deps if re.match(r"torch\s*==", d)).split("==")[1].strip()
    assert args["TORCH_VERSION"] == pin, "image torch pin differs from pyproject.toml"
    runs = [r for w, r in instrs if w == "RUN"]
    torch_i = next(i for i, r in enumerate(runs) if 'pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"' in r)
    pkg_i = next(i for i, r in enumerate(runs) if re.search(r"pip install --no-deps \.(\s|$)", r))
    deps_i = next(i for i, r in enumerate(runs) if "pip install -r /tmp/requirements.txt" in r)
    assert "['project']['dependencies']" in runs[deps_i], "dependencies come from pyproject.toml"
    assert torch_i < deps_i < pkg_i
    assert torch_i < pkg_i, "torch must come from the chosen index before `pip install .` resolves it"
    i_copy, i_pkg = instrs.index(("COPY", ". /app")), instrs.index(("RUN", runs[pkg_i]))
    i_deps = instrs.index(("RUN", runs[deps_i]))
    assert instrs.index(("WORKDIR", "/app")) < instrs.index(("COPY", "pyproject.toml /app/")) < i_deps < i_copy < i_pkg

    users = [r for w, r in instrs if w == "USER"]
    assert users and users[-1] not in ("root", "0") and words.index("USER") > i_pkg
    assert re.search(rf"useradd .*--uid \d+ .*{re.escape(users[-1])}", text)
    env = _env_pairs(instrs)
    for k, v in {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "true", "MLFLOW_DISABLE_TELEMETRY": "true",
                 "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "SPECDEC_HOME": "/data/specdec"}.items():
        assert env.get(k) == v, f"{name}: ENV {k}={env.get(k)!r}, want {v!r}"
    assert ("VOLUME", '["/data/specdec"]') in instrs
    assert re.search(r"chown \S+ /data/specdec", text), "the volume must be writable by the user"
    assert ("ENTRYPOINT", '["specdec"]') in instrs


def _dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Whether ``path`` (relative, /-separated) is left out of the build context (moby patternmatcher
    rules: patterns anchored at the context root, ``**`` any depth, a match on a parent directory
    excludes its contents, later ``!`` patterns re-include)."""
    def rx(p: str) -> re.Pattern:
        out, i = "", 0
        while i < len(p):
            if p.startswith("**", i):
                out += ".*"
                i += 2
                if p.startswith("/", i):
                    out = out[:-2] + "(?:.*/)?"
                    i += 1
            elif p[i] == "*":
                out, i = out + "[^/]*", i + 1
            elif p[i] == "?":
                out, i = out + "[^/]", i + 1
            else:
                out, i = out + re.escape(p[i]), i + 1
        return re.compile(out + "$")

    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for pat in patterns:
        neg = pat.startswith("!")
        r = rx(pat[1:] if neg else pat)
        if any(r.match(p) for p in prefixes):
            excluded = not neg
    return excluded


def test_dockerignore_keeps_sources_and_drops_local_state():
    # One .dockerignore at the context root: the legacy builder reads no <Dockerfile>.dockerignore.
    assert not list(DOCKER.glob("*.dockerignore"))
    path = REPO / ".dockerignore"
    patterns = [ln.strip().strip("/") for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    needed = [p for p in tracked if p.split("/")[0] in ("specdec", "registry", "monitoring", "flows")
              or p in ("pyproject.toml", "README.md", "prefect.yaml")]
    assert any(p.startswith("specdec/data/") for p in needed)
    dropped = [p for p in needed if _dockerignore_excludes(patterns, p)]
    assert not dropped, f"build context would lose {dropped[:5]}"
    for p in ["pyproject.toml", "README.md", "prefect.yaml", "flows/nightly.py", "specdec/data/heldout/x.jsonl"]:
        assert not _dockerignore_excludes(patterns, p), p
    for p in [".venv/bin/python", ".git/HEAD", ".env", "docker/.env", ".specdec/history.db", "mlruns/0/meta.yaml",
              "specdec/__pycache__/x.pyc", "specdec.egg-info/PKG-INFO", "sub/mlflow.db",
              ".specdec/docker/wheelhouse/torch-2.13.0+cpu.whl", "tests/conftest.py"]:
        assert _dockerignore_excludes(patterns, p), f"{p} would be sent to the Docker daemon"


def test_both_images_share_the_volume_owner():
    """worker and gpu-worker mount the same specdec-data volume: the same uid must own it in both images."""
    uids = {n: re.search(r"useradd .*--uid (\d+)", "\n".join(r for _, r in parse_dockerfile(DOCKER / n))).group(1)
            for n in ("Dockerfile.cpu", "Dockerfile.cuda")}
    assert len(set(uids.values())) == 1 and "0" not in uids.values(), uids


def test_watch_service_receives_mlflow_webhooks_inside_the_stack():
    svcs = resolved_compose(SPECDEC_WATCH_SECRET="w" * 32)["services"]
    watch, mlflow = svcs["watch"], svcs["mlflow"]
    argv = service_argv(watch)
    assert argv[:4] == ["specdec", "pair", "watch", "specdec-pair"]
    assert flag_value(argv, "--listen") == "0.0.0.0:8765" and flag_value(argv, "--url") == "http://watch:8765/webhook"
    env = watch["environment"]
    assert env["SPECDEC_WATCH_SECRET"] == "w" * 32 and env["SPECDEC_WATCH_REVERT"] == "false"
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000" and env["PREFECT_API_URL"] == "http://prefect-server:4200/api"
    assert "SPECDEC_WATCH_SECRET" not in mlflow.get("environment", {})  # the server gets it per webhook, not by env
    assert "http" in mlflow["environment"]["MLFLOW_WEBHOOK_ALLOWED_SCHEMES"].split(",")
    assert mlflow["environment"]["MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS"] == "true"
    assert "8765" in " ".join(watch["healthcheck"]["test"]) and not watch.get("ports")  # internal only
