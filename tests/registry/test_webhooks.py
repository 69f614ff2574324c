"""MLflow webhook deliveries: the signature MLflow computes verifies, anything else is refused with a
reason that holds no secret; deliveries are recorded once (real SQLite history store)."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from registry.webhooks import DeliveryRefused, parse_event, sign, verify_delivery
from tests.support.registry import open_registry_at

SECRET = "s3cret-value-for-tests-0123456789"


def _delivery(body: dict, *, secret: str = SECRET, ts: int | None = None, delivery_id: str | None = None):
    from mlflow.webhooks.delivery import _generate_hmac_signature  # MLflow's own signer

    text = json.dumps(body)
    did, stamp = delivery_id or str(uuid.uuid4()), str(int(time.time()) if ts is None else ts)
    headers = {"X-MLflow-Delivery-Id": did, "X-MLflow-Timestamp": stamp,
               "X-MLflow-Signature": _generate_hmac_signature(secret, did, stamp, text)}
    return headers, text.encode()


EVENT = {"entity": "model_version_alias", "action": "created", "timestamp": "2026-12-01T10:00:00+00:00",
         "data": {"name": "specdec-pair", "alias": "champion", "version": "3"}}


def test_mlflow_signature_verifies_and_parses():
    headers, body = _delivery(EVENT)
    ev = verify_delivery({k.lower(): v for k, v in headers.items()}, body, SECRET)
    assert (ev.event, ev.name, ev.alias, ev.version) == ("model_version_alias.created", "specdec-pair", "champion", "3")
    assert ev.sent_at == "2026-12-01T10:00:00+00:00" and ev.delivery_id == headers["X-MLflow-Delivery-Id"]
    assert sign(SECRET, ev.delivery_id, headers["X-MLflow-Timestamp"], body.decode()) == headers["X-MLflow-Signature"]


@pytest.mark.parametrize("case", ["wrong-secret", "tampered", "missing", "stale", "future", "not-json"])
def test_bad_deliveries_are_refused_without_the_secret(case):
    headers, body = _delivery(EVENT, secret="another-secret-entirely" if case == "wrong-secret" else SECRET,
                              ts=int(time.time()) - 3600 if case == "stale" else int(time.time()) + 3600 if case == "future" else None)
    if case == "tampered":
        body = body.replace(b'"3"', b'"4"')
    if case == "missing":
        del headers["X-MLflow-Signature"]
    if case == "not-json":
        body = b"hello"
        headers["X-MLflow-Signature"] = sign(SECRET, headers["X-MLflow-Delivery-Id"], headers["X-MLflow-Timestamp"], "hello")
    with pytest.raises(DeliveryRefused) as e:
        verify_delivery(headers, body, SECRET)
    sig = headers.get("X-MLflow-Signature", "")[3:]
    assert SECRET not in str(e.value) and (not sig or sig not in str(e.value))
    if case in ("stale", "future"):
        assert "replay refused" in str(e.value)


def test_parse_other_events():
    ev = parse_event("d", 1, json.dumps({"entity": "model_version_alias", "action": "deleted",
                                         "timestamp": "t", "data": {"name": "p", "alias": "champion"}}))
    assert ev.version is None and ev.alias == "champion"
    ev = parse_event("d", 1, json.dumps({"entity": "model_version_tag", "action": "set", "timestamp": "t",
                                         "data": {"name": "p", "version": "2", "key": "specdec.validate", "value": "now"}}))
    assert (ev.key, ev.value, ev.version) == ("specdec.validate", "now", "2")


def test_decide_and_record_once(tmp_path):
    from flows.watch import decide
    from monitoring.db import Database
    from monitoring.deliveries import deliveries, record_delivery, release_trigger

    def ev(entity, action, **data):
        return parse_event(str(uuid.uuid4()), 1, json.dumps({"entity": entity, "action": action, "timestamp": "t1",
                                                             "data": {"name": "p", **data}}))

    pairs = ["p"]
    assert decide(ev("model_version", "created", version="2"), pairs) == ("validate", "validate:p:2")
    assert decide(ev("model_version_alias", "created", alias="challenger", version="2"), pairs) == ("validate", "validate:p:2")
    assert decide(ev("model_version_alias", "created", alias="champion", version="2"), pairs) == (
        "gate-champion", "gate-champion:p:2:t1")
    assert decide(ev("model_version_tag", "set", version="2", key="validation_status", value="x"), pairs)[1] is None
    assert decide(ev("model_version_alias", "deleted", alias="champion"), pairs)[1] is None
    assert decide(parse_event("d", 1, json.dumps({"entity": "model_version", "action": "created", "timestamp": "t",
                                                  "data": {"name": "other", "version": "1"}})), pairs)[1] is None

    db = Database(f"sqlite:///{tmp_path / 'h.db'}")
    db.upgrade()
    kw = dict(event="model_version.created", model_name="p", version="2", action="validate")
    first = record_delivery(db, "d1", trigger_key="validate:p:2", **kw)
    assert first.outcome == "new"
    assert record_delivery(db, "d1", trigger_key="validate:p:2", **kw).outcome == "duplicate"
    assert record_delivery(db, "d2", trigger_key="validate:p:2", **kw).outcome == "already"
    release_trigger(db, first.row_id, "prefect down")  # a failed start frees the version for a retry
    assert record_delivery(db, "d3", trigger_key="validate:p:2", **kw).outcome == "new"
    rows = deliveries(db)
    assert [r.delivery_id for r in rows] == ["d1", "d2", "d3"] and rows[0].action.startswith("failed: prefect down")


def test_a_second_watcher_does_not_silently_take_the_first_ones_webhook(tmp_path, monkeypatch):
    """issue 32, minor: a second ``pair watch`` for the same MLflow rewrote the first one's webhook."""
    from registry import RegistryError
    from registry.webhooks import _all_webhooks, subscribe
    from registry.service import Registry
    from registry.settings import get_settings as registry_settings
    from tests.support.mlflow_server import MlflowServer

    monkeypatch.setenv("MLFLOW_WEBHOOK_ALLOWED_SCHEMES", "http,https")
    monkeypatch.setenv("MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS", "true")
    server = MlflowServer(tmp_path / "mlflow").start()
    try:
        first = subscribe(["pw"], "http://127.0.0.1:8765/webhook", "s" * 20, registry=open_registry_at(server.uri))
        assert subscribe(["pw"], "http://127.0.0.1:8765/webhook", "s" * 20, registry=open_registry_at(server.uri)) == first
        with pytest.raises(RegistryError, match="already sends to http://127.0.0.1:8765/.*--replace"):
            subscribe(["pw"], "http://127.0.0.1:9999/webhook", "s" * 20, registry=open_registry_at(server.uri))
        [hook] = _all_webhooks(Registry(registry_settings(), tracking_uri=server.uri).client)
        assert hook.url == "http://127.0.0.1:8765/webhook"  # the first watcher still receives its events
        assert subscribe(["pw"], "http://127.0.0.1:9999/webhook", "s" * 20, registry=open_registry_at(server.uri),
                         replace=True) == first
        [hook] = _all_webhooks(Registry(registry_settings(), tracking_uri=server.uri).client)
        assert hook.url == "http://127.0.0.1:9999/webhook"
    finally:
        server.stop()
